"""Proxies of fiber's managers: how they pickle, auto proxies, asynchronous calls.

A fiber proxy pickles to :func:`rebuild_proxy`, which gives it the run's authkey from
the receiving process's own environment (the secret never travels in a pickle) and
keeps the class of its manager (:class:`Detached`), so methods returning proxies work
in any process of the run.

:class:`AsyncBaseProxy` (made by :func:`AsyncAutoProxy`) returns an
:class:`AsyncResult` from every method call at once. Each such proxy has its own
connection to the server (an :class:`AsyncLine`), served by its own thread there:
requests are sent at once, replies are read in order by whoever waits for one.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from fiber.errors import ConnectionLostError, ProcessError
from fiber.errors import TimeoutError as FiberTimeoutError
from fiber.runtime.managers import stdlib
from fiber.runtime.managers.connection import CONNECT_TIMEOUT, share_authkey
from fiber.runtime.managers.stdlib import PROXY, RETURN
from fiber.wire import auth

__all__ = ["Detached", "rebuild_proxy", "FiberProxyMixin", "BaseProxy", "AsyncResult",
           "AsyncLine", "AsyncBaseProxy", "AutoProxy", "AsyncAutoProxy"]


class Detached:
    """The manager of a proxy unpickled in another process: only its registry (so
    methods returning proxies work there too)."""

    def __init__(self, manager_class: type) -> None:
        self._class = manager_class
        self._registry = manager_class._registry  # type: ignore[attr-defined]
        self._state = None


def rebuild_proxy(func: Callable[..., Any], token: Any, serializer: str,
                  kwds: dict[str, Any], manager_class: type | None = None) -> Any:
    """Unpickle a proxy in any process of the run: it authenticates with the run's
    secret (carried by the job's environment, never by the pickle)."""
    kwds.setdefault("authkey", auth.get_authkey())
    share_authkey()
    proxy = stdlib.rebuild_proxy(func, token, serializer, kwds)
    if isinstance(proxy, stdlib.BaseProxy) and cast(Any, proxy)._manager is None \
            and manager_class is not None:
        cast(Any, proxy)._manager = Detached(manager_class)
    return proxy


class FiberProxyMixin:
    """Pickling of fiber proxies: rebuilt through :func:`rebuild_proxy`."""

    _fiber_auto_factory: Callable[..., Any] | None = None

    if TYPE_CHECKING:  # set by the standard library's BaseProxy (see .stdlib)
        _token: Any
        _serializer: str
        _manager: Any
        _authkey: bytes
        _Client: Callable[..., Any]
        _id: str
        _exposed_: tuple[str, ...]
        _isauto: bool

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        kwds: dict[str, Any] = {}
        func: Any
        if getattr(self, "_isauto", False):
            kwds["exposed"] = self._exposed_
            func = self._fiber_auto_factory
        else:
            func = type(self)
        manager = self._manager
        manager_class: type | None = manager if isinstance(manager, type) else type(manager)
        if isinstance(manager, Detached):
            manager_class = manager._class
        elif manager is None:
            manager_class = None
        return (rebuild_proxy, (func, self._token, self._serializer, kwds, manager_class))


class BaseProxy(FiberProxyMixin, stdlib.BaseProxy):
    """Base of fiber's synchronous proxies (subclass it for ``register(proxytype=)``)."""


class AsyncResult:
    """The handle an :class:`~fiber.managers.AsyncManager` proxy's method returns at
    once. Until its outcome has arrived it holds its proxy, so the object the call
    runs on stays in the server even if the proxy itself was dropped."""

    def __init__(self, line: AsyncLine, methodname: str, proxy: Any) -> None:
        self._line = line
        self._proxy = proxy
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
        """Whether the method returned without raising (ValueError if not ready)."""
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
        self._proxy = None

    def __repr__(self) -> str:
        state = "ready" if self._done else "pending"
        return f"<AsyncResult {self._methodname}() {state}>"


class AsyncLine:
    """One proxy's own connection: requests are sent at once, replies are read in
    order by whoever waits for one.

    The line keeps what it needs of its proxy, never the proxy itself (the proxy's
    finalizer, which closes the line, holds it: a line holding its proxy would keep
    the proxy, its manager and the manager's server alive until the program exits),
    and its pending handles only weakly (a handle holds its proxy, which holds the
    line): a handle dropped unread has its reply read and discarded in turn."""

    def __init__(self, proxy: AsyncBaseProxy) -> None:
        self._ident = proxy._id
        self._address = proxy._token.address
        self._serializer = proxy._serializer
        self._authkey = proxy._authkey
        self._client = proxy._Client
        self._manager = proxy._manager
        self.conn = self._client(self._address, authkey=self._authkey)
        stdlib.accept_connection(self.conn, "AsyncLine")
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._pending: collections.deque[weakref.ref[AsyncResult]] = collections.deque()

    def call(self, proxy: Any, methodname: str, args: tuple, kwds: dict) -> AsyncResult:
        """Send one method call of ``proxy``; its result arrives in the handle
        returned."""
        handle = AsyncResult(self, methodname, proxy)
        with self._send_lock:
            self.conn.send((self._ident, methodname, args, kwds))
            self._pending.append(weakref.ref(handle))
        return handle

    def collect(self, handle: AsyncResult, timeout: float | None) -> None:
        """Read replies in order until ``handle``'s has arrived or ``timeout`` passed."""
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
                # a dropped handle's reply is still read (and a proxy it brings made,
                # so that its object is released in the server)
                outcome = self._outcome(kind, result)
                waiting = self._pending.popleft()()
                if waiting is not None:
                    waiting._set(*outcome)

    def _outcome(self, kind: str, result: Any) -> tuple[Any, BaseException | None]:
        if kind == RETURN:
            return result, None
        if kind == PROXY:
            exposed, token = result
            manager = self._manager
            if manager is None:
                return None, ProcessError("a proxy received from another process cannot "
                                          "create new proxies (no manager here)")
            proxytype = manager._registry[token.typeid][-1]
            token.address = self._address
            proxy = proxytype(token, self._serializer, manager=manager,
                              authkey=self._authkey, exposed=exposed)
            conn = self._client(token.address, authkey=self._authkey)
            try:
                stdlib.decref(conn, token.id)
            finally:
                conn.close()
            return proxy, None
        return None, stdlib.convert_to_error(kind, result)

    def _fail_all(self, exc: BaseException) -> None:
        while self._pending:
            waiting = self._pending.popleft()()
            if waiting is not None:
                waiting._set(error=exc)

    def close(self) -> None:
        """Close the connection (when the proxy is collected)."""
        self.conn.close()


_line_lock = threading.Lock()


class AsyncBaseProxy(BaseProxy):
    """A proxy whose method calls return an :class:`AsyncResult` at once."""

    def _callmethod(self, methodname: str, args: tuple = (),  # type: ignore[override]
                    kwds: dict | None = None) -> AsyncResult:
        """Send the call at once; its result arrives in the handle returned."""
        line = self.__dict__.get("_fiber_line")
        if line is None:
            with _line_lock:
                line = self.__dict__.get("_fiber_line")
                if line is None:
                    line = self.__dict__["_fiber_line"] = AsyncLine(self)
                    weakref.finalize(self, line.close)
        return line.call(self, methodname, tuple(args), dict(kwds or {}))

    def _getvalue(self) -> AsyncResult:
        return self._callmethod(stdlib.GETVALUE)

    def __str__(self) -> str:
        try:
            return self._callmethod("__repr__").get(CONNECT_TIMEOUT)
        except Exception:  # noqa: BLE001 - as the standard proxies do
            return repr(self)[:-1] + "; '__str__()' failed>"


_proxy_types: dict[tuple[type, str, tuple[str, ...]], type] = {}


def _make_proxy_type(base: type, name: str, exposed: tuple[str, ...]) -> type:
    key = (base, name, exposed)
    cls = _proxy_types.get(key)
    if cls is None:
        namespace: dict[str, Any] = {}
        for meth in exposed:
            exec(f"def {meth}(self, /, *args, **kwds):\n"  # noqa: S102 - as the stdlib does
                 f"    return self._callmethod({meth!r}, args, kwds)", namespace)
        cls = _proxy_types[key] = type(name, (base,), namespace)
        cls._exposed_ = exposed  # type: ignore[attr-defined]
    return cls


def _auto_proxy(base: type, factory: Callable[..., Any], token: Any, serializer: str,
                manager: Any = None, authkey: bytes | None = None,
                exposed: Any = None, incref: bool = True,
                manager_owned: bool = False) -> Any:
    client = stdlib.client_of(serializer)
    if exposed is None:
        conn = client(token.address, authkey=authkey)
        try:
            exposed = stdlib.get_methods(conn, token)
        finally:
            conn.close()
    if authkey is None and manager is not None:
        authkey = manager._authkey
    if authkey is None:
        authkey = auth.get_authkey()
    proxy_type: Any = _make_proxy_type(base, f"AutoProxy[{token.typeid}]", tuple(exposed))
    proxy_type._fiber_auto_factory = staticmethod(factory)
    proxy = proxy_type(token, serializer, manager=manager, authkey=authkey, incref=incref,
                       manager_owned=manager_owned)
    proxy._isauto = True
    return proxy


def AutoProxy(token: Any, serializer: str, manager: Any = None,
              authkey: bytes | None = None, exposed: Any = None, incref: bool = True,
              manager_owned: bool = False) -> BaseProxy:
    """A synchronous proxy exposing the referent's public methods."""
    return _auto_proxy(BaseProxy, AutoProxy, token, serializer, manager, authkey, exposed,
                       incref, manager_owned)


def AsyncAutoProxy(token: Any, serializer: str, manager: Any = None,
                   authkey: bytes | None = None, exposed: Any = None, incref: bool = True,
                   manager_owned: bool = False) -> AsyncBaseProxy:
    """A proxy whose methods return :class:`AsyncResult` handles."""
    return _auto_proxy(AsyncBaseProxy, AsyncAutoProxy, token, serializer, manager, authkey,
                       exposed, incref, manager_owned)
