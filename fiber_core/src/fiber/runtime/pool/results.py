"""Result objects of :class:`fiber.Pool`, with multiprocessing.pool's semantics:
``ApplyResult`` (``AsyncResult``), ``MapResult``, ``IMapIterator`` and
``IMapUnorderedIterator``. Each receives the outcome of its tasks through
``_set(start, count, ok, value)``; callbacks run in the parent, on the thread that
delivered the last result (so they should return quickly, as in multiprocessing): the
stream wire's selector thread, or the thread blocked in ``get()``/``wait()`` of an
``apply_async`` result, which reads its worker's connection itself."""

from __future__ import annotations

import _thread
import collections
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from fiber.errors import TimeoutError

_T = TypeVar("_T")


class ApplyResult(Generic[_T]):
    """The result of ``apply_async``; also the base of MapResult.

    Readiness is signalled by a bare lock that is held from creation until the outcome
    is in, not by a ``threading.Event``: an Event's condition variable costs a lock
    allocation and several Python calls per wait and per set, which is a quarter of the
    parent's CPU time on an ``apply_async(...).get()`` round trip."""

    def __init__(self, callback: Callable[[_T], object] | None = None,
                 error_callback: Callable[[BaseException], object] | None = None) -> None:
        self._done = _thread.allocate_lock()
        self._done.acquire()  # released once, when the outcome is in
        self._claim = _thread.allocate_lock()  # taken by the first outcome
        self._ready = False
        # set by the pool: waits by reading the worker's connection on this thread
        self._direct: Callable[[float | None], None] | None = None
        self._callback = callback
        self._error_callback = error_callback
        self._success = False
        self._value: Any = None

    def ready(self) -> bool:
        return self._ready

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        if self._ready:
            return
        if self._direct is not None and (timeout is None or timeout > 0):
            deadline = None if timeout is None else time.monotonic() + timeout
            self._direct(timeout)
            if self._ready:
                return
            if deadline is not None:
                timeout = max(0.0, deadline - time.monotonic())
        if timeout is None:
            got = self._done.acquire()
        elif timeout > 0:
            got = self._done.acquire(True, timeout)
        else:
            got = self._done.acquire(False)
        if got:
            self._done.release()  # every other waiter passes too

    def get(self, timeout: float | None = None) -> _T:
        self.wait(timeout)
        if not self._ready:
            raise TimeoutError
        if self._success:
            return self._value
        raise self._value

    def _finish(self, ok: bool, value: Any) -> None:
        if not self._claim.acquire(False):
            return  # the first outcome stands
        self._success, self._value = ok, value
        try:
            if ok and self._callback is not None:
                self._callback(value)
            if not ok and self._error_callback is not None:
                self._error_callback(value)
        finally:
            self._ready = True
            self._done.release()

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        self._finish(ok, value)


AsyncResult = ApplyResult


class MapResult(ApplyResult[list[_T]]):
    """The result of ``map_async``/``starmap_async``: a list in input order, or the
    first failure."""

    def __init__(self, length: int, callback: Callable[[list[_T]], object] | None = None,
                 error_callback: Callable[[BaseException], object] | None = None) -> None:
        super().__init__(callback, error_callback)
        self._values: list[Any] = [None] * length
        self._left = length
        self._lock = threading.Lock()
        if length == 0:
            self._finish(True, [])

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._lock:
            if self._ready:
                return
            if ok:
                self._values[start:start + count] = value
                self._left -= count
                done = self._left == 0
            else:
                done = True
        if done:
            self._finish(ok, self._values if ok else value)


class IMapIterator(Generic[_T]):
    """The iterator of ``imap``: results in input order, as they become available."""

    def __init__(self, length: int) -> None:
        self._cond = threading.Condition()
        self._length = length
        self._next = 0
        self._outcomes: dict[int, tuple[bool, Any]] = {}

    def __iter__(self) -> IMapIterator[_T]:
        return self

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._cond:
            if ok:
                for offset, item in enumerate(value):
                    self._outcomes[start + offset] = (True, item)
            else:
                self._outcomes[start] = (False, value)
                for offset in range(1, count):  # the chunk failed as a whole
                    self._outcomes[start + offset] = (False, value)
            self._cond.notify_all()

    def _ready(self) -> bool:
        return self._next >= self._length or self._next in self._outcomes

    def next(self, timeout: float | None = None) -> _T:
        with self._cond:
            if not self._cond.wait_for(self._ready, timeout):
                raise TimeoutError
            if self._next >= self._length:
                raise StopIteration
            ok, value = self._outcomes.pop(self._next)
            self._next += 1
        if ok:
            return value
        raise value

    __next__ = next


class IMapUnorderedIterator(IMapIterator[_T]):
    """The iterator of ``imap_unordered``: results in the order they finish."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self._arrived: collections.deque[tuple[bool, Any]] = collections.deque()

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._cond:
            if ok:
                self._arrived.extend((True, item) for item in value)
            else:
                self._arrived.extend((False, value) for _ in range(count))
            self._cond.notify_all()

    def _ready(self) -> bool:
        return self._next >= self._length or bool(self._arrived)

    def next(self, timeout: float | None = None) -> _T:
        with self._cond:
            if not self._cond.wait_for(self._ready, timeout):
                raise TimeoutError
            if self._next >= self._length:
                raise StopIteration
            ok, value = self._arrived.popleft()
            self._next += 1
        if ok:
            return value
        raise value

    __next__ = next

