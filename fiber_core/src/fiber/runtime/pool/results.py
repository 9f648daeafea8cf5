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
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from fiber.errors import TimeoutError

_T = TypeVar("_T")

BUFFER = 64  # items an imap iterator moves to its buffer at once, past one chunk


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
        # set by the pool: waits by reading the worker's connection on this thread,
        # called as ``_direct(_task, self, timeout)``
        self._direct: Callable[[Any, ApplyResult[_T], float | None], None] | None = None
        self._task: Any = None
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
        task = self._task  # (None once the outcome is in: read once)
        if task is not None and self._direct is not None and (timeout is None or timeout > 0):
            deadline = None if timeout is None else time.monotonic() + timeout
            self._direct(task, self, timeout)
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
            # the task is not needed to wait any more: no cycle (the task's sink is
            # this result) keeps the two, with the task's function, for the collector
            self._task = None
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


_END = object()


class _Failure:
    """An item's exception in an iterator's buffer of values."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Consumer(Protocol):
    """What an imap iterator tells about its progress (:class:`fiber.runtime.pool.feeder.Feeder`)."""

    def consumed(self, items: int) -> None: ...

    def arrived(self, items: int) -> None: ...


class IMapIterator(Generic[_T]):
    """The iterator of ``imap``: results in input order, as they become available.

    Outcomes arrive a chunk at a time (``_set(start, count, ...)``, keyed by the index
    of the chunk's first item); ``next()`` moves every chunk that is next in order into
    a buffer under the lock and then hands the buffer's items out without it, so a
    chunk costs one lock round, not one per item (chunks of a few items are moved
    together, up to :data:`BUFFER` items: what the feeder counts as taken). ``length`` is the number of items,
    or None while a feeder is still reading the input (:meth:`_set_length`). A failed
    chunk raises its exception once per item, in place of each. ``for x in it``
    iterates a generator that hands out a chunk's items as fast as a list's (as
    multiprocessing's chunked imap does, a generator over the chunks)."""

    def __init__(self, length: int | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._length = length
        self._next = 0  # the index of the first item not moved into the buffer
        self._outcomes: dict[int, tuple[bool, Any, int]] = {}
        # chunks moved out of the outcomes: lists of values, or a _Failure per item
        self._buffer: collections.deque[Any] = collections.deque()
        self._current: Iterator[Any] = iter(())  # the items left of the chunk handed out
        self._feeder: Consumer | None = None

    def __iter__(self) -> Iterator[_T]:
        """A generator over this iterator's items, sharing its state with
        :meth:`next` (``next(it)`` and ``for x in it`` may alternate): it hands a
        chunk's items out at the speed of iterating a list."""
        return self._iterate()

    def _iterate(self) -> Iterator[_T]:
        while True:
            yield from self._current
            try:
                value = self._next_chunk(None)
            except StopIteration:
                return
            yield value

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._cond:
            self._outcomes[start] = (ok, value, count)
            if start == self._next:
                self._cond.notify_all()
        if self._feeder is not None:
            self._feeder.arrived(count)

    def _set_length(self, length: int) -> None:
        """The feeder read the input to its end: ``length`` items in all."""
        with self._cond:
            self._length = length
            self._cond.notify_all()

    def _fail_at(self, position: int, exc: BaseException) -> None:
        """The input ended with ``exc`` after ``position`` items: it is raised after
        their results, then the iterator ends."""
        self._set(position, 1, False, exc)
        self._set_length(position + 1)

    def _ready(self) -> bool:
        return self._next in self._outcomes or (
            self._length is not None and self._next >= self._length)

    def _take(self) -> int:
        """Move the outcomes that are next in order into the buffer (lock held);
        returns how many items were moved."""
        moved = 0
        outcomes = self._outcomes
        while moved < BUFFER and self._next in outcomes:
            moved += self._buffer_outcome(*outcomes.pop(self._next))
        return moved

    def _buffer_outcome(self, ok: bool, value: Any, count: int) -> int:
        """Put an outcome of ``count`` items in the buffer (a chunk's list of values, or
        its failure once per item) and move past them; returns ``count``."""
        self._next += count
        if ok:
            self._buffer.append(value)
        else:
            self._buffer.extend([_Failure(value)] * count)
        return count

    def next(self, timeout: float | None = None) -> _T:
        value = next(self._current, _END)
        if value is _END:
            return self._next_chunk(timeout)
        return value  # type: ignore[return-value]

    def _next_chunk(self, timeout: float | None) -> Any:
        """The first item of the next chunk (the rest in ``_current``)."""
        buffer = self._buffer
        while True:
            if not buffer:
                self._wait(timeout)
            try:
                entry = buffer.popleft()
            except IndexError:  # another thread took it
                continue
            if entry.__class__ is _Failure:
                raise entry.exc
            self._current = iter(entry)
            value = next(self._current, _END)
            if value is not _END:
                return value

    def _wait(self, timeout: float | None) -> None:
        """Move outcomes into the buffer, waiting up to ``timeout`` for one."""
        with self._cond:
            while not self._buffer:
                if not self._cond.wait_for(self._ready, timeout):
                    raise TimeoutError
                moved = self._take()
                if not moved and self._length is not None and self._next >= self._length:
                    raise StopIteration
                if moved and self._feeder is not None:
                    self._feeder.consumed(moved)

    __next__ = next


class IMapUnorderedIterator(IMapIterator[_T]):
    """The iterator of ``imap_unordered``: results in the order they finish."""

    def __init__(self, length: int | None = None) -> None:
        super().__init__(length)
        self._arrived: collections.deque[tuple[bool, Any, int]] = collections.deque()
        self._last: tuple[int, BaseException] | None = None

    def _fail_at(self, position: int, exc: BaseException) -> None:
        """As :meth:`IMapIterator._fail_at`: raised once the results of the
        ``position`` items before it are out (in multiprocessing the exception
        travels through a worker, so it comes after them too)."""
        with self._cond:
            self._last = (position, exc)
            self._length = position + 1
            self._cond.notify_all()

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self._cond:
            self._arrived.append((ok, value, count))
            self._cond.notify_all()
        if self._feeder is not None:
            self._feeder.arrived(count)

    def _ready(self) -> bool:
        return bool(self._arrived) or (
            self._length is not None and self._next >= self._length) or (
            self._last is not None and self._next >= self._last[0])

    def _take(self) -> int:
        moved = 0
        arrived = self._arrived
        while moved < BUFFER and arrived:
            moved += self._buffer_outcome(*arrived.popleft())
        if not arrived and self._last is not None and self._next >= self._last[0]:
            self._buffer.append(_Failure(self._last[1]))
            self._last = None
            self._next += 1
            moved += 1
        return moved
