"""The wire as the runtime uses it: the process-wide hubs and client connections.

A process has one hub per listen host (:func:`get_hub`, :mod:`fiber.wire.hub`) and
shares one client connection per address (:func:`get_client`): a pynng
:class:`~fiber.wire.nng_client.Client` for a hub's ``tcp://`` address, a
:class:`~fiber.wire.stream.client.StreamClient` for a ``stream://`` one. Everything
is closed once at exit (:func:`shutdown`, in fiber's ordered exit path). The wire
format of every message, handshake included, is described in
:mod:`fiber.wire.protocol`.

**Fork.** nng cannot be used at all in a process forked from one that used it (it
aborts the child: "nng is not fork-reentrant safe"). So before a fork every hub of this
process starts its stream listener, and in the forked child (:func:`forked`) the
connections of the parent are dropped unused and a connection to one of the parent's
hubs goes to that hub's stream wire (queues and pipes are served there too), while what
needs nng (a hub of its own, a connection to another process's hub) raises
:class:`ForkedProcessError` saying to use spawn or forkserver.

The classes the runtime annotates with are re-exported here (``transport.Hub``,
``transport.Request``, ``transport.Client``, ...), so that a runtime module needs this
one import of the wire's connections.
"""

from __future__ import annotations

import logging
import os
import threading

from fiber import util
from fiber.errors import ForkedProcessError
from fiber.wire import shm
from fiber.wire.channel import Channel, Request
from fiber.wire.hub import Hub
from fiber.wire.nng_client import Client, ClientContext
from fiber.wire.protocol import ERROR, STREAM_SCHEME
from fiber.wire.stream.client import StreamClient

__all__ = [
    "ERROR", "Channel", "Client", "ClientContext", "Hub", "Request", "StreamClient",
    "forked", "get_client", "get_hub", "local_hub", "reach_by_stream", "register_client",
    "shutdown",
]

_hubs: dict[str, Hub] = {}
_clients: dict[str, Client | StreamClient] = {}
_registry_lock = threading.Lock()
logger = logging.getLogger("fiber")

_nng_used = False  # this process made an nng socket (a hub or a client)
_forked = False  # this process is a fork of one that had used nng
_stream_of: dict[str, str] = {}  # in a forked child: the parent's hubs' stream addresses
_kept: list[object] = []  # the parent's connections, never used or closed in a forked child

FORKED_MESSAGE = (
    "this process was forked (os.fork, or multiprocessing's 'fork' start method) from a "
    "fiber process, and fiber's nng wire cannot be used after a fork: {what}. A forked "
    "child can use the queues and pipes its parent created; for anything else start it "
    "with the 'spawn' or 'forkserver' start method (multiprocessing.get_context('spawn'))")


def forked() -> bool:
    """Whether this process is a fork of a process that had used nng."""
    return _forked


def _before_fork() -> None:
    # a forked child reaches this process's hubs by their stream listeners
    with _registry_lock:
        hubs = list(_hubs.values())
    for hub in hubs:
        try:
            hub.stream_address  # noqa: B018 - starts the listener
        except Exception:  # noqa: BLE001 - the child will say it cannot connect
            logger.debug("cannot start the stream listener before fork", exc_info=True)


def _after_fork_in_child() -> None:
    global _registry_lock, _forked
    _registry_lock = threading.Lock()  # another thread of the parent may have held it
    if not (_nng_used or _hubs or _clients):
        return
    _forked = True
    util.forget_exit_callbacks()  # the parent's exit path is not the child's
    for hub in _hubs.values():
        if hub.stream_started:
            _stream_of[hub.address] = hub.stream_address
    # nng's sockets of the parent must not even be closed here (nng would abort)
    _kept.extend(_hubs.values())
    _kept.extend(_clients.values())
    _hubs.clear()
    _clients.clear()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def get_hub(host: str) -> Hub:
    """This process's hub for ``host`` (the listen address), created on first use.
    A process's first hub also sweeps the shared-memory segments that ended processes
    of this machine left behind (:func:`fiber.wire.shm.sweep`): every fiber program
    that talks to other processes cleans up after those that were killed."""
    global _nng_used
    if _forked:
        raise ForkedProcessError(FORKED_MESSAGE.format(
            what="it cannot create queues, pipes, processes or pools"))
    with _registry_lock:
        hub = _hubs.get(host)
        if hub is not None:
            return hub
        first = not _hubs
        _nng_used = True
        hub = _hubs[host] = Hub(host)
        util.at_exit("connections", util.CONNECTIONS, shutdown)
    if first:
        try:
            shm.sweep()
        except Exception:  # noqa: BLE001 - cleaning up after others is best effort
            logger.debug("sweeping shared-memory segments failed", exc_info=True)
    return hub


def reach_by_stream(address: str, stream_address: str) -> None:
    """Connections to the hub at ``address`` go to its stream wire at ``stream_address``
    from now on (a job reaches its parent's hub by one stream connection, and never
    starts nng, whose dozen threads would be most of a small job's start)."""
    _stream_of[address] = stream_address


def get_client(address: str) -> Client | StreamClient:
    """A shared client connection to ``address`` (created on first use): an nng
    :class:`Client`, or a :class:`~fiber.wire.stream.client.StreamClient` for a
    ``stream://`` address or a hub reached by its stream wire (:func:`reach_by_stream`,
    and in a forked child its parent's hubs)."""
    global _nng_used
    address = _stream_of.get(address, address)
    with _registry_lock:
        client = _clients.get(address)
        if client is not None and not client.lost:
            return client
    if address.startswith(STREAM_SCHEME):
        client = StreamClient(address)
    elif _forked:
        raise ForkedProcessError(FORKED_MESSAGE.format(
            what=f"it cannot connect to the fiber process at {address}, which is "
                 "not its parent"))
    else:
        _nng_used = True
        client = Client(address)
    with _registry_lock:
        _clients[address] = client
    util.at_exit("connections", util.CONNECTIONS, shutdown)
    return client


def register_client(client: Client | StreamClient) -> None:
    """Make ``client`` the shared connection to its address."""
    global _nng_used
    _nng_used = _nng_used or isinstance(client, Client)
    with _registry_lock:
        _clients[client.address] = client


def shutdown() -> None:
    """Close every client and hub of this process (at exit)."""
    with _registry_lock:
        clients, hubs = list(_clients.values()), list(_hubs.values())
        _clients.clear()
        _hubs.clear()
    for client in clients:
        client.close()
    for hub in hubs:
        hub.close()


def local_hub(address: str) -> Hub | None:
    """The hub of this process that listens on ``address``, if any."""
    with _registry_lock:
        for hub in _hubs.values():
            if hub.address == address:
                return hub
    return None
