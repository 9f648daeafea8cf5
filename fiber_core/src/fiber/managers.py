"""Managers: shared objects served by a job-backed process, as
:mod:`multiprocessing.managers`.

fiber reuses the standard library's manager machinery (``Server``, ``BaseProxy``,
``register``) and changes what must change for a cluster:

* the server runs in a :class:`fiber.Process` (a job on the selected backend) and
  listens on TCP at the address that job's backend says other jobs can reach
  (:func:`fiber.runtime.run.listen_host`, e.g. 127.0.0.1 on the local backend); it reports
  the bound address back over a fiber Pipe;
* the authkey is the run's secret (:func:`fiber.auth.get_authkey`), so any process of
  the run can use a proxy it received, on any machine;
* connections use the ``"fiber"`` serializer: TCP keepalive and a user timeout make a
  vanished server fail a call within seconds (:class:`fiber.ConnectionLostError`)
  instead of hanging, and an exception raised by a method in the server is re-raised
  in the caller with the remote traceback as its ``__cause__``.

:class:`AsyncManager` makes proxies whose method calls return an
:class:`AsyncResult` at once: each proxy has its own connection, served by its own
thread in the server, so calls on many objects run at the same time (objects of one
manager share its server process: calls that hold the GIL do not overlap; use several
managers to spread CPU-bound objects over processes and machines).

Without a manager, :func:`Lock`, :func:`RLock`, :func:`Semaphore`,
:func:`BoundedSemaphore`, :func:`Condition`, :func:`Event`, :func:`Barrier`,
:func:`Value` and :func:`Array` return proxies served by a :class:`SyncManager` this
process starts on first use. Every operation is then a network round trip to that
manager (about 0.4-0.5 ms on the local backend of a 2-core machine, measured by
tests/portable/test_managers.py), not a shared-memory access.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import multiprocessing
import multiprocessing.managers as _mpm
import multiprocessing.process as _mpp
import socket
import threading
import time
import traceback
import weakref
from multiprocessing import connection as _mpc
from multiprocessing import util as _mpu
from multiprocessing.sharedctypes import typecode_to_type
from typing import Any

from fiber import util
from fiber.errors import ConnectionLostError, ProcessError
from fiber.errors import TimeoutError as FiberTimeoutError
from fiber.runtime import run
from fiber.wire import auth

__all__ = [
    "BaseManager", "SyncManager", "AsyncManager", "AsyncResult", "BaseProxy", "AutoProxy",
    "AsyncAutoProxy", "Namespace", "Token", "RemoteTraceback", "Manager",
    "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier",
    "Value", "Array", "shutdown_implicit_manager",
]

logger = logging.getLogger("fiber.managers")

Token = _mpm.Token
Namespace = _mpm.Namespace
SERIALIZER = "fiber"
CONNECT_TIMEOUT = 5.0      # seconds to reach a manager's server
DEAD_PEER_TIMEOUT = 6.0    # a server that stops answering TCP is given up after this
START_TIMEOUT = 300.0      # the server's job must report its address within this
SHUTDOWN_TIMEOUT = 10.0


# -- the "fiber" serializer: connections -----------------------------------------------
class RemoteTraceback(Exception):
    """The traceback of an exception raised in a manager's server (its ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _tune(sock: socket.socket) -> None:
    """Low latency and prompt detection of a peer that vanished without closing."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", int(DEAD_PEER_TIMEOUT * 1000))):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _is_error(obj: Any) -> bool:
    return (isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "#ERROR"
            and isinstance(obj[1], BaseException))


class _ServerConnection(_mpc.Connection):
    """The server's end: an exception sent back carries its formatted traceback."""

    def send(self, obj: Any) -> None:
        if _is_error(obj) and obj[1].__traceback__ is not None:
            exc = obj[1]
            try:
                exc._fiber_remote_tb = "".join(traceback.format_exception(exc))
            except (AttributeError, TypeError):  # an exception type without __dict__
                pass
        super().send(obj)


class _ClientConnection(_mpc.Connection):
    """A proxy's end: a lost server raises ConnectionLostError; a remote exception gets
    its traceback as ``__cause__``."""

    address: tuple = ()

    def _lost(self, exc: BaseException) -> ConnectionLostError:
        host, port = self.address[:2] if self.address else ("?", "?")
        return ConnectionLostError(
            f"the manager at {host}:{port} is gone ({type(exc).__name__}: {exc}); its "
            "process has ended or its host is unreachable")

    # the lowest level: also covers send_bytes/recv_bytes (the authkey handshake)
    def _send(self, buf, *args) -> None:
        try:
            super()._send(buf, *args)
        except OSError as exc:
            raise self._lost(exc) from None

    def _recv(self, size, *args):
        try:
            return super()._recv(size, *args)
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None

    def send(self, obj: Any) -> None:
        try:
            super().send(obj)
        except ConnectionLostError:
            raise
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None

    def recv(self) -> Any:
        try:
            obj = super().recv()
        except ConnectionLostError:
            raise
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None
        if _is_error(obj):
            text = getattr(obj[1], "_fiber_remote_tb", None)
            if text:
                obj[1].__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
        return obj


class Listener:
    """A manager server's listening socket (``Listener`` of the "fiber" serializer).
    Authentication is done by the server's handler threads."""

    def __init__(self, address: tuple, family: str | None = None, backlog: int = 16,
                 authkey: bytes | None = None) -> None:
        host = address[0]
        family_ = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server(tuple(address), family=family_, backlog=backlog)
        self.address = self._sock.getsockname()[:2]

    def accept(self) -> _ServerConnection:
        sock, _ = self._sock.accept()
        _tune(sock)
        return _ServerConnection(sock.detach())

    def close(self) -> None:
        self._sock.close()


def Client(address: tuple, family: str | None = None,
           authkey: bytes | None = None) -> _ClientConnection:
    """Connect to a manager's server (``Client`` of the "fiber" serializer)."""
    host, port = address[:2]
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise ConnectionLostError(
            f"cannot reach the manager at {host}:{port} ({exc}): its process has ended, "
            "or this host cannot reach that address (see the listen_address setting)"
        ) from None
    sock.settimeout(None)
    _tune(sock)
    conn = _ClientConnection(sock.detach())
    conn.address = tuple(address)
    if authkey is not None:
        try:
            _mpc.answer_challenge(conn, authkey)
            _mpc.deliver_challenge(conn, authkey)
        except BaseException:
            conn.close()
            raise
    return conn


_mpm.listener_client[SERIALIZER] = (Listener, Client)


def _share_authkey() -> None:
    """multiprocessing's authkey becomes the run's secret, so that proxies of user-made
    proxy classes that pickle through the standard library authenticate too (done on
    first use, never at import: a preloading fork server imports fiber before it knows
    the run)."""
    key = auth.get_authkey()
    if bytes(_mpp.current_process().authkey) != key:
        _mpp.current_process().authkey = key


# -- proxies -----------------------------------------------------------------------------
class _Detached:
    """The manager of a proxy unpickled in another process: only its registry (so
    methods returning proxies work there too)."""

    def __init__(self, manager_class: type) -> None:
        self._class = manager_class
        self._registry = manager_class._registry
        self._state = None


def _rebuild_proxy(func, token, serializer, kwds, manager_class=None):
    """Unpickle a proxy in any process of the run: it authenticates with the run's
    secret (carried by the job's environment, never by the pickle)."""
    kwds.setdefault("authkey", auth.get_authkey())
    _share_authkey()
    proxy = _mpm.RebuildProxy(func, token, serializer, kwds)
    if isinstance(proxy, _mpm.BaseProxy) and proxy._manager is None \
            and manager_class is not None:
        proxy._manager = _Detached(manager_class)
    return proxy


class _FiberProxyMixin:
    """Pickling of fiber proxies: rebuilt through :func:`_rebuild_proxy`."""

    _fiber_auto_factory = None

    def __reduce__(self):
        kwds: dict = {}
        if getattr(self, "_isauto", False):
            kwds["exposed"] = self._exposed_
            func = self._fiber_auto_factory
        else:
            func = type(self)
        manager = self._manager
        manager_class = manager if isinstance(manager, type) else type(manager)
        if isinstance(manager, _Detached):
            manager_class = manager._class
        elif manager is None:
            manager_class = None
        return (_rebuild_proxy, (func, self._token, self._serializer, kwds, manager_class))


class BaseProxy(_FiberProxyMixin, _mpm.BaseProxy):
    """Base of fiber's synchronous proxies (subclass it for ``register(proxytype=)``)."""


class AsyncResult:
    """The handle an :class:`AsyncManager` proxy's method returns at once."""

    def __init__(self, line: _AsyncLine, methodname: str) -> None:
        self._line = line
        self._methodname = methodname
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def ready(self) -> bool:
        """True once the result has arrived (reads what already has)."""
        if not self._done:
            self._line.collect(self, 0.0)
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result has arrived or ``timeout`` seconds have passed."""
        if not self._done:
            self._line.collect(self, timeout)

    def successful(self) -> bool:
        if not self._done:
            raise ValueError(f"{self!r} not ready")
        return self._error is None

    def get(self, timeout: float | None = None) -> Any:
        """The method's return value; raises what the method raised, or
        :class:`fiber.TimeoutError` after ``timeout`` seconds."""
        self.wait(timeout)
        if not self._done:
            raise FiberTimeoutError(f"{self._methodname}() gave no result within {timeout}s")
        if self._error is not None:
            raise self._error
        return self._value

    def _set(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error, self._done = value, error, True

    def __repr__(self) -> str:
        state = "ready" if self._done else "pending"
        return f"<AsyncResult {self._methodname}() {state}>"


class _AsyncLine:
    """One proxy's own connection: requests are sent at once, replies are read in
    order by whoever waits for one."""

    def __init__(self, proxy: AsyncBaseProxy) -> None:
        self._proxy = proxy
        token = proxy._token
        self.conn = proxy._Client(token.address, authkey=proxy._authkey)
        _mpm.dispatch(self.conn, None, "accept_connection", ("AsyncLine",))
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._pending: collections.deque[AsyncResult] = collections.deque()

    def call(self, methodname: str, args: tuple, kwds: dict) -> AsyncResult:
        handle = AsyncResult(self, methodname)
        with self._send_lock:
            self.conn.send((self._proxy._id, methodname, args, kwds))
            self._pending.append(handle)
        return handle

    def collect(self, handle: AsyncResult, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._recv_lock:
            while not handle._done:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if not self.conn.poll(max(0.0, left)):
                        return
                try:
                    kind, result = self.conn.recv()
                except ConnectionLostError as exc:
                    self._fail_all(exc)
                    raise
                self._pending.popleft()._set(*self._outcome(kind, result))

    def _outcome(self, kind: str, result: Any) -> tuple[Any, BaseException | None]:
        if kind == "#RETURN":
            return result, None
        if kind == "#PROXY":
            exposed, token = result
            manager = self._proxy._manager
            if manager is None:
                return None, ProcessError("a proxy received from another process cannot "
                                          "create new proxies (no manager here)")
            proxytype = manager._registry[token.typeid][-1]
            token.address = self._proxy._token.address
            proxy = proxytype(token, self._proxy._serializer, manager=manager,
                              authkey=self._proxy._authkey, exposed=exposed)
            conn = self._proxy._Client(token.address, authkey=self._proxy._authkey)
            _mpm.dispatch(conn, None, "decref", (token.id,))
            return proxy, None
        return None, _mpm.convert_to_error(kind, result)

    def _fail_all(self, exc: BaseException) -> None:
        while self._pending:
            self._pending.popleft()._set(error=exc)

    def close(self) -> None:
        self.conn.close()


class AsyncBaseProxy(BaseProxy):
    """A proxy whose method calls return an :class:`AsyncResult` at once."""

    def _callmethod(self, methodname: str, args: tuple = (), kwds: dict | None = None):
        line = self.__dict__.get("_fiber_line")
        if line is None:
            with _line_lock:
                line = self.__dict__.get("_fiber_line")
                if line is None:
                    line = self.__dict__["_fiber_line"] = _AsyncLine(self)
                    weakref.finalize(self, line.close)
        return line.call(methodname, tuple(args), dict(kwds or {}))

    def _getvalue(self):
        return self._callmethod("#GETVALUE")

    def __str__(self) -> str:
        try:
            return self._callmethod("__repr__").get(CONNECT_TIMEOUT)
        except Exception:  # noqa: BLE001 - as the standard proxies do
            return repr(self)[:-1] + "; '__str__()' failed>"


_line_lock = threading.Lock()
_proxy_types: dict = {}


def _make_proxy_type(base: type, name: str, exposed: tuple) -> type:
    key = (base, name, exposed)
    cls = _proxy_types.get(key)
    if cls is None:
        namespace: dict = {}
        for meth in exposed:
            exec(f"def {meth}(self, /, *args, **kwds):\n"  # noqa: S102 - as the stdlib does
                 f"    return self._callmethod({meth!r}, args, kwds)", namespace)
        cls = _proxy_types[key] = type(name, (base,), namespace)
        cls._exposed_ = exposed
    return cls


def _auto_proxy(base: type, factory, token, serializer, manager=None, authkey=None,
                exposed=None, incref=True, manager_owned=False):
    _, client = _mpm.listener_client[serializer]
    if exposed is None:
        conn = client(token.address, authkey=authkey)
        try:
            exposed = _mpm.dispatch(conn, None, "get_methods", (token,))
        finally:
            conn.close()
    if authkey is None and manager is not None:
        authkey = manager._authkey
    if authkey is None:
        authkey = auth.get_authkey()
    proxy_type = _make_proxy_type(base, f"AutoProxy[{token.typeid}]", tuple(exposed))
    proxy_type._fiber_auto_factory = staticmethod(factory)
    proxy = proxy_type(token, serializer, manager=manager, authkey=authkey, incref=incref,
                       manager_owned=manager_owned)
    proxy._isauto = True
    return proxy


def AutoProxy(token, serializer, manager=None, authkey=None, exposed=None, incref=True,
              manager_owned=False):
    """A synchronous proxy exposing the referent's public methods."""
    return _auto_proxy(BaseProxy, AutoProxy, token, serializer, manager, authkey, exposed,
                       incref, manager_owned)


def AsyncAutoProxy(token, serializer, manager=None, authkey=None, exposed=None, incref=True,
                   manager_owned=False):
    """A proxy whose methods return :class:`AsyncResult` handles."""
    return _auto_proxy(AsyncBaseProxy, AsyncAutoProxy, token, serializer, manager, authkey,
                       exposed, incref, manager_owned)


def _fiber_proxy_class(std: type) -> type:
    """fiber's version of a standard proxy class (same methods, fiber pickling)."""
    name = std.__name__
    if isinstance(globals().get(name), type) and issubclass(globals()[name], std):
        return globals()[name]
    cls = type(name, (_FiberProxyMixin, std), {"__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls


# -- managers ------------------------------------------------------------------------------
State = _mpm.State
_started: weakref.WeakSet = weakref.WeakSet()


class BaseManager(_mpm.BaseManager):
    """:class:`multiprocessing.managers.BaseManager` whose server is a fiber job.

    ``address`` defaults to the reachable address of the server's job with a free
    port; ``authkey`` to the run's secret.
    """

    _default_proxy = staticmethod(AutoProxy)

    def __init__(self, address: tuple | None = None, authkey: bytes | None = None,
                 serializer: str = SERIALIZER, ctx=None, *,
                 shutdown_timeout: float = SHUTDOWN_TIMEOUT) -> None:
        if serializer not in _mpm.listener_client:
            raise ValueError(f"unknown serializer {serializer!r}: use 'fiber' (the default)")
        _share_authkey()
        super().__init__(address, authkey if authkey is not None else auth.get_authkey(),
                         serializer, ctx, shutdown_timeout=shutdown_timeout)

    @classmethod
    def register(cls, typeid: str, callable=None, proxytype=None, exposed=None,  # noqa: A002
                 method_to_typeid=None, create_method: bool = True) -> None:
        """Register a type (or callable) the manager can create, as in multiprocessing."""
        if not isinstance(typeid, str) or not typeid.isidentifier():
            raise ValueError(f"typeid must be a Python identifier, not {typeid!r}")
        if callable is not None and not builtins_callable(callable):
            raise TypeError(f"register({typeid!r}, ...): {callable!r} is not callable")
        if proxytype is None:
            proxytype = cls._default_proxy
        super().register(typeid, callable, proxytype, exposed, method_to_typeid,
                         create_method)

    def get_server(self):
        """A server to run in this process (``serve_forever()``)."""
        if self._address is None:
            self._address = (run.listen_host(), 0)
        return super().get_server()

    def start(self, initializer=None, initargs=()) -> None:
        """Start the server as a fiber job and wait until it listens."""
        from fiber.connection import Pipe
        from fiber.process import Process

        if self._state.value != State.INITIAL:
            if self._state.value == State.STARTED:
                raise ProcessError("Already started server")
            raise ProcessError(f"Unknown state {self._state.value!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        reader, writer = Pipe(duplex=False)
        self._process = Process(
            target=type(self)._run_server,
            args=(self._registry, self._address, None, self._serializer, writer,
                  initializer, initargs),
            name=type(self).__name__, daemon=True)
        self._process.start()
        try:
            self._address = self._await_address(reader)
        except BaseException:
            self._process.kill()
            raise
        finally:
            reader.close()
        self._state.value = State.STARTED
        self.shutdown = _mpu.Finalize(
            self, type(self)._finalize_manager,
            args=(self._process, self._address, self._authkey, self._state, self._Client,
                  self._shutdown_timeout),
            exitpriority=0)
        _started.add(self)
        util.at_exit("managers", util.MANAGERS, _shutdown_all)
        logger.debug("%s serving at %s:%s", type(self).__name__, *self._address)

    def _await_address(self, reader) -> tuple:
        deadline = time.monotonic() + START_TIMEOUT
        while not reader.poll(0.5):
            if not self._process.is_alive():
                self._process.join(5)  # raises ProcessStartError if the job never ran
                raise ProcessError(
                    f"the server of {type(self).__name__} ended (exit code "
                    f"{self._process.exitcode}) before it listened; see its output above")
            if time.monotonic() > deadline:
                raise ProcessError(f"the server of {type(self).__name__} did not start "
                                   f"within {START_TIMEOUT:.0f}s")
        return tuple(reader.recv())

    @classmethod
    def _run_server(cls, registry, address, authkey, serializer, writer, initializer=None,
                    initargs=()):
        """In the server's job: listen at this job's reachable address."""
        if address is None:
            address = (run.listen_host(), 0)
        _share_authkey()
        super()._run_server(registry, address, auth.get_authkey(), serializer, writer,
                            initializer, initargs)

    @staticmethod
    def _finalize_manager(process, address, authkey, state, _Client, shutdown_timeout):
        """Ask the server to stop; terminate, then kill its job if it does not."""
        try:
            if process.is_alive():
                try:
                    conn = _Client(address, authkey=authkey)
                    try:
                        _mpm.dispatch(conn, None, "shutdown")
                    finally:
                        conn.close()
                except Exception:  # noqa: BLE001 - the server may be gone already
                    logger.debug("asking the manager to shut down failed", exc_info=True)
                for end in (None, process.terminate, process.kill):
                    if end is not None and process.is_alive():
                        end()
                    try:
                        process.join(timeout=shutdown_timeout)
                    except ProcessError:
                        break
                    if not process.is_alive():
                        break
        finally:
            state.value = State.SHUTDOWN
            _mpm.BaseProxy._address_to_local.pop(address, None)

    def __repr__(self) -> str:
        where = f" at {self._address[0]}:{self._address[1]}" if self._address else ""
        return f"<{type(self).__name__}{where} state={self._state.value}>"


builtins_callable = callable


class AsyncManager(BaseManager):
    """A manager whose proxies' methods return :class:`AsyncResult` handles at once
    (``register`` makes :func:`AsyncAutoProxy` proxies unless told otherwise)."""

    _default_proxy = staticmethod(AsyncAutoProxy)


# -- SyncManager -----------------------------------------------------------------------
class _SharedValue:
    """What :func:`Value` serves: a ctypes value and the lock of ``get_lock()``."""

    def __init__(self, typecode_or_type, *args) -> None:
        ctype = typecode_to_type.get(typecode_or_type, typecode_or_type)
        self._obj = ctype(*args)
        self._lock = threading.RLock()

    def get(self):
        return self._obj.value

    def set(self, value) -> None:
        self._obj.value = value

    def get_lock(self):
        return self._lock


class _SharedArray(_SharedValue):
    """What :func:`Array` serves: a ctypes array and the lock of ``get_lock()``."""

    def __init__(self, typecode_or_type, size_or_initializer) -> None:
        ctype = typecode_to_type.get(typecode_or_type, typecode_or_type)
        if isinstance(size_or_initializer, int):
            self._obj = (ctype * size_or_initializer)()
        else:
            items = list(size_or_initializer)
            self._obj = (ctype * len(items))(*items)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, index):
        return self._obj[index]

    def __setitem__(self, index, value) -> None:
        self._obj[index] = value

    def get_raw(self):
        return self._obj.raw


class _SynchronizedMixin:
    _lock_proxy = None

    def get_lock(self):
        if self._lock_proxy is None:
            self._lock_proxy = self._callmethod("get_lock")
        return self._lock_proxy

    def acquire(self, *args):
        return self.get_lock().acquire(*args)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self):
        return self.get_lock().__enter__()

    def __exit__(self, *exc):
        return self.get_lock().__exit__(*exc)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_lock_proxy", None)
        return state


class SynchronizedValueProxy(_SynchronizedMixin, BaseProxy):
    """What :func:`Value` returns: ``.value``, ``get_lock()``, ``with v:``."""

    _exposed_ = ("get", "set", "get_lock")
    _method_to_typeid_ = {"get_lock": "_SharedLock"}

    def get(self):
        return self._callmethod("get")

    def set(self, value) -> None:
        self._callmethod("set", (value,))

    value = property(get, set)


class SynchronizedArrayProxy(_SynchronizedMixin, BaseProxy):
    """What :func:`Array` returns: indexing, slicing, ``len``, ``get_lock()``."""

    _exposed_ = ("__len__", "__getitem__", "__setitem__", "get", "set", "get_raw",
                 "get_lock")

    def __len__(self) -> int:
        return self._callmethod("__len__")

    def __getitem__(self, index):
        return self._callmethod("__getitem__", (index,))

    def __setitem__(self, index, value) -> None:
        self._callmethod("__setitem__", (index, value))

    def _get_value(self):
        return self._callmethod("get")

    def _set_value(self, value) -> None:
        self._callmethod("set", (value,))

    value = property(_get_value, _set_value)
    raw = property(lambda self: self._callmethod("get_raw"))


def _server_pool(processes=None, initializer=None, initargs=(), maxtasksperchild=None):
    """The manager's ``Pool``: multiprocessing workers on the manager's machine, started
    through a forkserver (forking the threaded server itself can hang)."""
    ctx = multiprocessing.get_context("forkserver")
    return ctx.Pool(processes, initializer, initargs, maxtasksperchild)


class SyncManager(BaseManager):
    """:class:`multiprocessing.managers.SyncManager` served by a fiber job: Queue,
    JoinableQueue, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event, Barrier,
    Pool, list, dict, Value, Array, Namespace.

    ``Pool`` runs multiprocessing workers inside the manager's job (on its machine);
    :class:`fiber.Pool` spreads workers over the cluster."""


for _typeid, (_callable, _exposed, _m2t, _proxytype) in _mpm.SyncManager._registry.items():
    if _typeid == "Pool":
        _callable = _server_pool
    if _proxytype is _mpm.AutoProxy:
        _proxytype = AutoProxy
    else:
        _proxytype = _fiber_proxy_class(_proxytype)
    SyncManager.register(_typeid, _callable, _proxytype, _exposed, _m2t,
                         create_method=_callable is not None
                         and _typeid not in ("AsyncResult", "Iterator"))
SyncManager.register("_SharedLock", None, globals()["AcquirerProxy"], create_method=False)
SyncManager.register("SynchronizedValue", _SharedValue, SynchronizedValueProxy,
                     method_to_typeid={"get_lock": "_SharedLock"})
SyncManager.register("SynchronizedArray", _SharedArray, SynchronizedArrayProxy,
                     method_to_typeid={"get_lock": "_SharedLock"})
del _typeid, _callable, _exposed, _m2t, _proxytype


def Manager() -> SyncManager:
    """A started :class:`SyncManager` (``fiber.Manager()``)."""
    manager = SyncManager()
    manager.start()
    return manager


# -- primitives without an explicit manager ------------------------------------------------
_implicit: list[SyncManager | None] = [None]
_implicit_lock = threading.Lock()


def _implicit_manager() -> SyncManager:
    with _implicit_lock:
        manager = _implicit[0]
        if manager is None or manager._state.value != State.STARTED \
                or not manager._process.is_alive():
            manager = _implicit[0] = Manager()
        return manager


def shutdown_implicit_manager() -> None:
    """Stop the manager behind :func:`Lock`, :func:`Value`... of this process (it is a
    child process, listed by ``active_children()``; the next use starts a new one, and
    proxies of the old one stop working)."""
    with _implicit_lock:
        manager, _implicit[0] = _implicit[0], None
    if manager is not None and manager._state.value == State.STARTED:
        manager.shutdown()


def Lock():
    """A lock usable by every process of the run (served by this process's manager)."""
    return _implicit_manager().Lock()


def RLock():
    """A reentrant lock usable by every process of the run."""
    return _implicit_manager().RLock()


def Semaphore(value: int = 1):
    """A semaphore usable by every process of the run."""
    return _implicit_manager().Semaphore(value)


def BoundedSemaphore(value: int = 1):
    """A bounded semaphore usable by every process of the run."""
    return _implicit_manager().BoundedSemaphore(value)


def Condition(lock=None):
    """A condition variable usable by every process of the run (``lock``, if given,
    must be a lock of the same manager, e.g. from :func:`Lock`)."""
    return _implicit_manager().Condition(lock)


def Event():
    """An event usable by every process of the run."""
    return _implicit_manager().Event()


def Barrier(parties: int, action=None, timeout: float | None = None):
    """A barrier usable by every process of the run."""
    return _implicit_manager().Barrier(parties, action, timeout)


def _check_lock(lock) -> None:
    if not isinstance(lock, bool):
        raise ValueError(f"lock={lock!r}: fiber's Value and Array take lock=True or False "
                         "(the value lives in a manager and always has its own lock, "
                         "get_lock())")


def _check_type(typecode_or_type) -> None:
    if isinstance(typecode_or_type, str):
        if typecode_or_type not in typecode_to_type:
            raise ValueError(f"unknown typecode {typecode_or_type!r}: use one of "
                             f"{''.join(sorted(typecode_to_type))} or a ctypes type")
    elif not (isinstance(typecode_or_type, type)
              and issubclass(typecode_or_type, ctypes._SimpleCData)):
        raise TypeError(f"{typecode_or_type!r} is neither a typecode nor a ctypes type")


def Value(typecode_or_type, *args, lock: bool = True):
    """A ctypes value usable by every process of the run: ``.value``, ``get_lock()``."""
    _check_lock(lock)
    _check_type(typecode_or_type)
    return _implicit_manager().SynchronizedValue(typecode_or_type, *args)


def Array(typecode_or_type, size_or_initializer, *, lock: bool = True):
    """A ctypes array usable by every process of the run."""
    _check_lock(lock)
    _check_type(typecode_or_type)
    return _implicit_manager().SynchronizedArray(typecode_or_type, size_or_initializer)


def _shutdown_all() -> None:
    """At exit, before fiber ends its children: stop the managers of this process."""
    for manager in list(_started):
        try:
            if manager._state.value == State.STARTED:
                manager.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("shutting down %r failed", manager, exc_info=True)

