"""How a process serves the shared objects it created to processes of other hosts.

A lock, a value or an array made by :mod:`fiber.synchronize` or
:mod:`fiber.sharedctypes` lives in the process that created it, over shared memory:
processes of the creator's host attach to that memory and use it natively. A process
of another host (another container, node or pod) cannot; it uses the object through
its creator instead. The first time an object is pickled, its creator registers it
here (:func:`token_for`): this starts, once per process, a manager server in a thread
of the creator (the standard library's ``Server`` with fiber's connections, listening
at the address the backend says other jobs can reach) and the pickle carries the
object's token. A process of another host rebuilds a proxy from the token
(:func:`proxy_of`): each operation is one round trip to the creator, run there on the
native object by a thread that serves that proxy's connection (one per thread of the
caller, so a lock acquired by a remote thread is owned by that thread's server thread,
and released by it, as the semantics of ``RLock`` and ``Condition`` need).

An object served here is kept as long as its creator lives (another process may hold
it at any time, and a pickle in flight cannot be counted); the server stops at the
creator's exit, after its children have been joined (:data:`fiber.util.SHARED_STATE`).
A process that uses a proxy after the creator is gone gets
:class:`fiber.ConnectionLostError` naming the creator, never a hang.

The types that can be served are registered with :func:`register` by the modules that
make them (a proxy's type must be known in the process that rebuilds it: it imports
the module that registered it, because the pickle names a function of that module).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fiber import threads, util
from fiber.runtime import run
from fiber.runtime.managers import connection, stdlib, sync
from fiber.runtime.managers.proxies import rebuild_proxy
from fiber.runtime.managers.serving import FiberServer, accept_died, accept_forever
from fiber.wire import auth

__all__ = ["SERIALIZER", "register", "token_for", "proxy_of", "serving", "stop"]

logger = logging.getLogger("fiber.shared")

#: the serializer of creators' servers: the manager's, with errors naming the creator
SERIALIZER = "fiber-creator"
_SERVER_NAME = "the process that created this shared object"


def _client(address: tuple, family: str | None = None,
            authkey: bytes | None = None) -> connection.ClientConnection:
    return connection.Client(address, family, authkey, server=_SERVER_NAME)


stdlib.register_serializer(SERIALIZER, connection.Listener, _client)

# typeid -> (callable, exposed, method_to_typeid, proxytype), as a manager's registry
_registry: dict[str, tuple[Any, Any, Any, Any]] = {
    entry.typeid: (None, entry.exposed, entry.method_to_typeid, entry.proxytype)
    for entry in sync.registrations()
}

_lock = threading.Lock()
_server: Any = None
_listener: Any = None
_stopping = False
_tokens: dict[int, Any] = {}  # id(obj) -> token, for the objects served (kept alive)
_kept: list[Any] = []


def register(typeid: str, proxytype: type, exposed: Sequence[str] | None = None,
             method_to_typeid: Mapping[str, str] | None = None) -> None:
    """Make objects of ``typeid`` servable, used elsewhere through ``proxytype``
    (``exposed``: the methods a proxy may call; default: the proxy type's
    ``_exposed_``)."""
    if exposed is None:
        exposed = getattr(proxytype, "_exposed_", None)
    if method_to_typeid is None:
        method_to_typeid = getattr(proxytype, "_method_to_typeid_", None)
    _registry[typeid] = (None, tuple(exposed) if exposed is not None else None,
                         dict(method_to_typeid) if method_to_typeid else None, proxytype)
    if _server is not None:
        _server.registry[typeid] = _registry[typeid]


def _start() -> Any:
    global _server, _listener
    connection.share_authkey()
    server = FiberServer(dict(_registry), (run.listen_host(), 0), auth.get_authkey(),
                         SERIALIZER)
    _listener = server.listener
    server.stop_event = threading.Event()  # serve_forever() would set it; lines read it
    # a thread per authenticated connection (the listener's gate admits them)
    threads.start("fiber-shared-server", accept_forever, server, "fiber-shared-line",
                  lambda: _stopping, fails=lambda error: accept_died(server, error))
    util.at_exit("shared state", util.SHARED_STATE, stop)
    logger.debug("serving shared objects of pid %d at %s:%s", os.getpid(), *server.address)
    _server = server
    return server


def token_for(obj: Any, typeid: str) -> Any:
    """The token of ``obj`` (created by this process) in this process's server,
    registering it (and starting the server) the first time."""
    token = _tokens.get(id(obj))
    if token is not None:
        return token
    if typeid not in _registry:
        raise TypeError(f"no shared type {typeid!r} is registered")
    with _lock:
        token = _tokens.get(id(obj))
        if token is not None:
            return token
        server = _server if _server is not None else _start()
        exposed = _registry[typeid][1]
        if exposed is None:
            exposed = [name for name in dir(obj) if not name.startswith("_")
                       and callable(getattr(obj, name))]
        ident = f"{id(obj):x}"
        with server.mutex:
            server.id_to_obj[ident] = (obj, set(exposed), _registry[typeid][2])
            # the creator's own reference, never dropped (added to the count of
            # proxies the server may have made of the same object by method_to_typeid)
            server.id_to_refcount[ident] = server.id_to_refcount.get(ident, 0) + 1
        token = stdlib.Token(typeid, server.address, ident)
        _kept.append(obj)
        _tokens[id(obj)] = token
        return token


def proxy_of(token: Any) -> Any:
    """A proxy of the object ``token`` names, for a process that cannot attach to it."""
    try:
        proxytype = _registry[token.typeid][3]
    except KeyError:
        raise TypeError(f"no shared type {token.typeid!r} is registered") from None
    return rebuild_proxy(proxytype, token, SERIALIZER, {}, _Registry)


class _Registry:
    """The "manager" of proxies of shared objects: the registry, so that a method
    returning a proxy (``method_to_typeid``) works in the process that called it."""

    _registry = _registry


def serving() -> bool:
    """Whether this process serves shared objects (its server has started)."""
    return _server is not None


def stop() -> None:
    """At exit, after the children were joined: stop serving (the objects' users on
    other hosts get ConnectionLostError from then on)."""
    global _stopping
    _stopping = True
    if _server is not None:
        _server.stop_event.set()
    listener = _listener
    if listener is not None:
        try:
            listener.close()
        except OSError:
            pass
