"""Everything fiber's managers take from the internals of the standard library.

fiber's managers are :mod:`multiprocessing.managers` with fiber's processes, its
connections and the run's authkey. The standard library offers no extension API
beyond subclassing ``BaseManager``/``BaseProxy`` and ``register()``, so fiber also
relies on names that are private or undocumented. They are all taken here, each with
the reason, and the rest of fiber reaches them only through this module: a change of
CPython touches this file alone. The names are checked when this module is imported,
so a Python that lacks one fails at ``import`` with a message naming it, not in a
call later.

Taken from :mod:`multiprocessing.managers`
  ``BaseManager``, ``BaseProxy``, ``SyncManager``, ``AutoProxy`` (public classes)
    fiber's managers and proxies subclass the first two; ``SyncManager``'s registry
    (the private ``SyncManager._registry``) is the list of types fiber's SyncManager
    serves; ``AutoProxy`` marks the entries of that registry that use auto proxies.
  ``Server`` (undocumented)
    the server of a manager: a process that creates shared objects serves them to
    other hosts with one, in a thread of its own (:mod:`fiber.runtime.shared.served`).
  ``Token``, ``Namespace``, ``State`` (undocumented)
    a proxy's reference to its object; the namespace type; a manager's states.
  ``dispatch``, ``convert_to_error`` (undocumented)
    one request to a manager's server and its answer, and the exception an error
    answer stands for: fiber's asynchronous proxies send and read on their own.
  the server's requests ``accept_connection``, ``get_methods``, ``decref``,
  ``shutdown`` and the answer kinds ``#RETURN``, ``#ERROR``, ``#PROXY``,
  ``#GETVALUE`` (the private protocol of ``Server``)
    fiber's asynchronous proxies speak it directly (:func:`accept_connection`...).
  ``listener_client`` (undocumented)
    the table of serializers: fiber adds its own, ``"fiber"`` (:func:`register_serializer`).
  ``RebuildProxy`` (undocumented)
    unpickles a proxy (ownership and reference counting); fiber's proxies unpickle
    through it after giving it the run's authkey.
  ``BaseManager._run_server`` (private classmethod)
    creates the server, reports its address and serves: fiber's server job calls it
    (:func:`run_server`).
  ``BaseProxy._address_to_local`` (private)
    per-thread connections of proxies by manager address: forgotten when a manager
    shuts down (:func:`forget_address`), as the standard library does.
  ``BaseManager(..., shutdown_timeout=)`` (from Python 3.11)
    passed only where the standard library takes it (:func:`manager_init_kwargs`).

Taken from elsewhere
  ``multiprocessing.connection.Connection`` (constructed from a socket's descriptor,
  undocumented; its private ``_send``/``_recv`` are overridden)
    the connections of the ``"fiber"`` serializer, which turn a lost socket into
    ``ConnectionLostError`` at the lowest level (the handshake too).
  ``multiprocessing.connection.answer_challenge``/``deliver_challenge`` (undocumented)
    the authkey handshake a manager's server expects (:func:`authenticate`).
  ``multiprocessing.connection.CHALLENGE``, ``WELCOME``, ``FAILURE``, ``MESSAGE_LENGTH``
  and, from Python 3.12, ``_create_response`` and ``_verify_challenge`` (private)
    the same handshake's messages and digests, which fiber's gate speaks without a
    thread per connection (:func:`new_challenge`, :func:`verify_response`,
    :func:`response_to`; :mod:`fiber.runtime.managers.admission`).
  ``multiprocessing.process.current_process().authkey``
    set to the run's secret, so proxies of user-made proxy classes that pickle through
    the standard library authenticate too (:func:`set_process_authkey`).
  ``multiprocessing.util.Finalize`` (undocumented)
    a started manager's ``shutdown()``, as the standard library makes it.
  ``multiprocessing.sharedctypes.typecode_to_type`` (undocumented)
    the typecodes ``Value`` and ``Array`` accept.
  ``ctypes._SimpleCData`` (private)
    the base of ctypes' simple types, which ``Value`` and ``Array`` also accept.

Attributes fiber's subclasses read or set (the standard library's ``__init__`` sets
them): a manager's ``_registry``, ``_state``, ``_process``, ``_address``,
``_authkey``, ``_serializer``, ``_Client``, ``_shutdown_timeout``, ``shutdown``; a
proxy's ``_token``, ``_serializer``, ``_manager``, ``_authkey``, ``_Client``, ``_id``,
``_exposed_``, ``_isauto``, ``_method_to_typeid_``, ``_callmethod``.
"""

from __future__ import annotations

import ctypes
import hmac
import multiprocessing.connection as _mpc
import multiprocessing.managers as _mpm
import multiprocessing.process as _mpp
import multiprocessing.sharedctypes as _mps
import multiprocessing.util as _mpu
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "BaseManager", "BaseProxy", "SyncManager", "AutoProxy", "Server", "Token", "Namespace",
    "State", "RemoteError",
    "Connection", "Finalize", "typecode_to_type", "RETURN", "ERROR", "PROXY", "GETVALUE",
    "dispatch", "convert_to_error", "accept_connection", "get_methods", "decref",
    "shutdown_server", "register_serializer", "has_serializer", "client_of",
    "rebuild_proxy", "run_server", "forget_address", "sync_registry",
    "manager_init_kwargs", "authenticate", "set_process_authkey", "is_simple_ctype",
    "CHALLENGE", "WELCOME", "FAILURE", "new_challenge", "verify_response", "response_to",
]


def _check() -> None:
    """Fail at import, naming what is missing, on a Python whose multiprocessing lacks
    a name this module takes."""
    wanted: list[tuple[Any, str, Iterable[str]]] = [
        (_mpm, "multiprocessing.managers",
         ("BaseManager", "BaseProxy", "SyncManager", "AutoProxy", "Server", "Token", "Namespace",
          "State", "dispatch", "convert_to_error", "listener_client", "RebuildProxy")),
        (_mpm.BaseManager, "multiprocessing.managers.BaseManager", ("_run_server",)),
        (_mpm.SyncManager, "multiprocessing.managers.SyncManager", ("_registry",)),
        (_mpm.BaseProxy, "multiprocessing.managers.BaseProxy",
         ("_address_to_local", "_callmethod")),
        (_mpc, "multiprocessing.connection",
         ("Connection", "answer_challenge", "deliver_challenge", "CHALLENGE", "WELCOME",
          "FAILURE", "MESSAGE_LENGTH")),
        (_mpc.Connection, "multiprocessing.connection.Connection", ("_send", "_recv")),
        (_mpu, "multiprocessing.util", ("Finalize",)),
        (_mps, "multiprocessing.sharedctypes", ("typecode_to_type",)),
        (ctypes, "ctypes", ("_SimpleCData",)),
    ]
    missing = [f"{where}.{name}" for owner, where, names in wanted for name in names
               if not hasattr(owner, name)]
    if missing:
        raise ImportError(
            f"fiber's managers need {', '.join(missing)}, which Python "
            f"{sys.version.split()[0]} does not have (see {__name__})")


_check()

# the undocumented names, which the type stubs of the standard library do not describe
_mpm_undocumented: Any = _mpm
_mpc_undocumented: Any = _mpc
_mps_undocumented: Any = _mps

# -- classes and types ---------------------------------------------------------------------
BaseManager = _mpm.BaseManager
BaseProxy = _mpm.BaseProxy
SyncManager = _mpm.SyncManager
AutoProxy = _mpm_undocumented.AutoProxy
Server = _mpm_undocumented.Server
Token = _mpm.Token
Namespace = _mpm.Namespace
RemoteError = _mpm.RemoteError  # public: what proxies raise for server errors
State = _mpm_undocumented.State
Connection = _mpc.Connection
Finalize = _mpu.Finalize
typecode_to_type: dict[str, type] = _mps_undocumented.typecode_to_type

# -- the server's protocol -------------------------------------------------------------------
RETURN = "#RETURN"      # the answer to a request: its result
ERROR = "#ERROR"        # the answer to a request: the exception it raised
PROXY = "#PROXY"        # the answer to a request: (exposed, token) of a new object
GETVALUE = "#GETVALUE"  # the request for a copy of the referent

dispatch: Callable[..., Any] = _mpm_undocumented.dispatch
convert_to_error: Callable[[str, Any], BaseException] = _mpm_undocumented.convert_to_error


def accept_connection(conn: Any, name: str) -> None:
    """Make ``conn`` a line served by its own thread of the server, named ``name``."""
    dispatch(conn, None, "accept_connection", (name,))


def get_methods(conn: Any, token: Any) -> list[str]:
    """The methods the server exposes for ``token``'s object."""
    return dispatch(conn, None, "get_methods", (token,))


def decref(conn: Any, ident: str) -> None:
    """Drop one reference of the server's object ``ident``."""
    dispatch(conn, None, "decref", (ident,))


def shutdown_server(conn: Any) -> None:
    """Ask the server to stop."""
    dispatch(conn, None, "shutdown")


# -- serializers, proxies, servers ------------------------------------------------------------
def register_serializer(name: str, listener: Callable[..., Any],
                        client: Callable[..., Any]) -> None:
    """Make ``name`` a serializer managers and proxies accept."""
    _mpm_undocumented.listener_client[name] = (listener, client)


def has_serializer(name: str) -> bool:
    """Whether ``name`` is a serializer managers accept."""
    return name in _mpm_undocumented.listener_client


def client_of(serializer: str) -> Callable[..., Any]:
    """The function that connects to a server of ``serializer``."""
    return _mpm_undocumented.listener_client[serializer][1]


def rebuild_proxy(func: Callable[..., Any], token: Any, serializer: str,
                  kwds: dict[str, Any]) -> Any:
    """Unpickle a proxy (the standard library's ``RebuildProxy``)."""
    return _mpm_undocumented.RebuildProxy(func, token, serializer, kwds)


def run_server(cls: type, registry: dict[str, Any], address: tuple, authkey: bytes,
               serializer: str, writer: Any, initializer: Callable[..., object] | None,
               initargs: Iterable[Any]) -> None:
    """In a server's process: create ``cls``'s server, send its address to ``writer``
    and serve until asked to stop (the standard library's ``_run_server``)."""
    _mpm_undocumented.BaseManager._run_server.__func__(
        cls, registry, address, authkey, serializer, writer, initializer, initargs)


def forget_address(address: tuple) -> None:
    """Drop this process's per-thread proxy connections to the manager at ``address``."""
    _mpm.BaseProxy._address_to_local.pop(address, None)


def sync_registry() -> dict[str, tuple[Any, Any, Any, Any]]:
    """The standard SyncManager's types: ``{typeid: (callable, exposed,
    method_to_typeid, proxytype)}``."""
    return dict(_mpm_undocumented.SyncManager._registry)


def manager_init_kwargs(shutdown_timeout: float) -> dict[str, Any]:
    """The keyword arguments of ``BaseManager.__init__`` this Python has."""
    if sys.version_info >= (3, 11):
        return {"shutdown_timeout": shutdown_timeout}
    return {}


# -- connections, authkey, ctypes ----------------------------------------------------------------
def authenticate(conn: Any, authkey: bytes) -> None:
    """The client's side of the authkey handshake with a manager's server."""
    _mpc_undocumented.answer_challenge(conn, authkey)
    _mpc_undocumented.deliver_challenge(conn, authkey)


CHALLENGE: bytes = _mpc_undocumented.CHALLENGE
WELCOME: bytes = _mpc_undocumented.WELCOME
FAILURE: bytes = _mpc_undocumented.FAILURE


def new_challenge() -> bytes:
    """What a server's challenge carries after :data:`CHALLENGE`, as this Python's
    ``deliver_challenge`` makes it."""
    nonce = os.urandom(_mpc_undocumented.MESSAGE_LENGTH)
    if hasattr(_mpc, "_create_response"):  # 3.12: the digest is named first
        return b"{sha256}" + nonce
    return nonce


def verify_response(authkey: bytes, challenge: bytes, response: bytes) -> bool:
    """Whether ``response`` answers the server's ``challenge`` with ``authkey``."""
    verify = getattr(_mpc, "_verify_challenge", None)
    if verify is not None:
        try:
            verify(authkey, challenge, response)
        except _mpc_undocumented.AuthenticationError:
            return False
        return True
    return hmac.compare_digest(hmac.new(authkey, challenge, "md5").digest(), response)


def response_to(authkey: bytes, challenge: bytes) -> bytes:
    """The server's answer to a client's ``challenge`` (what follows CHALLENGE)."""
    create = getattr(_mpc, "_create_response", None)
    if create is not None:
        return create(authkey, challenge)
    return hmac.new(authkey, challenge, "md5").digest()


def set_process_authkey(key: bytes) -> None:
    """Make ``key`` the authkey multiprocessing's own proxies use in this process."""
    process = _mpp.current_process()
    if bytes(process.authkey) != key:
        process.authkey = key


def is_simple_ctype(obj: object) -> bool:
    """Whether ``obj`` is a simple ctypes type (``c_int``, ``c_double``...)."""
    return isinstance(obj, type) and issubclass(obj, ctypes._SimpleCData)
