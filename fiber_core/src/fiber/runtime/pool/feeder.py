"""The feeder of one ``imap``/``imap_unordered``: reads the input lazily, a window at a
time, and submits it to the pool's pending table in chunks.

A thread of its own reads the input (as multiprocessing's task handler does: the
iterable may be slow or block), so ``imap`` returns at once and an infinite iterator
works. The *window* bounds the chunks submitted whose results the caller has not taken
yet (moved into its iterator's buffer): :func:`~fiber.runtime.pool.chunking.window`
chunks (the pool's chunking policy, :mod:`~fiber.runtime.pool.chunking`: at least four
per worker plus two, and at least ``READ_AHEAD`` items, fewer for big items, judged by
the first item's pickled size). When the
window is full the feeder waits until the caller has taken half of it, then reads the
next half at once and submits it in one call under the pool's lock.

After ``close()`` the window counts the chunks not *finished* instead of not taken, so
that ``close(); join()`` runs every item of a finite input even when nobody reads the
results (``join()`` waits for the feeder, as for every task: the table counts feeders
still reading in :meth:`Scheduler.unfinished`). The feeder stops reading, its input
left unread, when the pool is terminated (the iterator then raises ``ValueError`` after
the results of what was submitted) or when its iterator was garbage collected (nobody
can read the results: an ``imap`` loop left with ``break``).

An exception raised by the input ends the input where it happened, as in
multiprocessing: the results of the chunks read before it, then that exception from
``next()`` at its position, then ``StopIteration`` (the items of a chunk the exception
interrupted are not run, as there).
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fiber import threads
from fiber.runtime.pool.chunking import pickled_size, window
from fiber.runtime.pool.results import IMapIterator
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import RUN, TERMINATE

logger = logging.getLogger("fiber")

POLL = 1.0  # seconds between checks of the pool's state while the window is full


class _Delivery:
    """The sink of a feeder's tasks: delivers to the imap's iterator while it exists.
    The tasks hold this, not the iterator, so that an iterator its caller dropped is
    collected (and its feeder stops) even while tasks of it are queued or running."""

    __slots__ = ("_ref", "__weakref__")  # (the table knows a map's sink weakly)

    def __init__(self, ref: weakref.ref[IMapIterator[Any]]) -> None:
        self._ref = ref

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        sink = self._ref()
        if sink is not None:
            sink._set(start, count, ok, value)


class Feeder:
    """Reads ``iterable`` for the imap whose iterator is ``sink`` (held weakly) and
    submits ``func`` over it in chunks of ``chunksize`` under ``lock``.
    :meth:`start` starts its thread; the table must count it (``scheduler.feed_started()``)."""

    def __init__(self, scheduler: Scheduler, lock: threading.RLock,
                 func: Callable[..., Any], iterable: Iterable[Any], chunksize: int,
                 kind: int, sink: IMapIterator[Any],
                 on_end: Callable[[Feeder], None]) -> None:
        self._scheduler = scheduler
        self._lock = lock
        self._func = func
        self._iterable: Iterable[Any] | None = iterable
        self._chunksize = chunksize
        self._kind = kind
        self._on_end = on_end
        self._cond = threading.Condition()  # an RLock: wake() may run in a GC callback
        self._sink = weakref.ref(sink, lambda _: self.wake())
        self._delivery = _Delivery(self._sink)
        self._submitted = 0  # items submitted
        self._taken = 0  # items the caller moved into its iterator's buffer
        self._finished = 0  # items whose outcome arrived
        self._wake_taken = 1 << 62  # wake the thread when _taken reaches this
        self._wake_finished = 1 << 62
        self._position = 0  # items submitted
        self._item_bytes = 0  # the first item's pickled size: big items, fewer ahead
        sink._feeder = self
        self.thread = threads.start("fiber-pool-feeder", self._run, fails=self._died,
                                    started=False)

    def start(self) -> None:
        self.thread.start()

    def _died(self, error: BaseException) -> None:
        """The thread died (a bug of ours): the caller's iteration raises ``error`` at
        the position reached, rather than wait for ever."""
        try:
            sink = self._sink()
            if sink is not None:
                sink._fail_at(self._position, error)
        finally:
            self._on_end(self)

    # -- what the iterator reports (any thread; no lock of ours held) ----------------
    def consumed(self, items: int) -> None:
        self._taken += items
        if self._taken >= self._wake_taken:
            self._wake_taken = 1 << 62  # once: the thread sets the next mark
            self.wake()

    def arrived(self, items: int) -> None:
        self._finished += items
        if self._finished >= self._wake_finished:
            self._wake_finished = 1 << 62
            self.wake()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------
    def _room(self) -> int | None:
        """Wait until half the window is free; returns how many chunks to read, or None
        when reading is over (terminated, or the iterator is gone). Counts in items."""
        never = 1 << 62
        with self._cond:
            while True:
                state = self._scheduler.pool_state()
                if state == TERMINATE or self._sink() is None:
                    return None
                size = self._chunksize
                limit = window(self._scheduler.size(), size, self._item_bytes) * size
                step = max(1, limit // size // 2) * size
                if state == RUN:
                    used = self._submitted - self._taken
                else:  # closed: nobody needs to read the results for the items to run
                    used = self._submitted - self._finished
                if limit - used >= step or used == 0:
                    self._wake_taken = self._wake_finished = never
                    return max(1, (limit - used) // size)
                wake_at = self._submitted - (limit - step)
                # the mark is set before the count is read again: a report that came
                # in meanwhile is seen here, or it sees the mark and wakes us
                if state == RUN:
                    self._wake_taken, self._wake_finished = wake_at, never
                    passed = self._taken >= wake_at
                else:
                    self._wake_taken, self._wake_finished = never, wake_at
                    passed = self._finished >= wake_at
                if not passed:
                    self._cond.wait(POLL)

    def _read(self, it: Iterator[Any], chunks: int) -> tuple[list[Any], bool, BaseException | None]:
        """Up to ``chunks`` chunks of items; whether the input ended; its exception."""
        size = self._chunksize
        items: list[Any] = []
        try:
            for _ in range(chunks):
                chunk = list(itertools.islice(it, size))
                items.extend(chunk)
                if len(chunk) < size:
                    return items, True, None
        except Exception as exc:  # noqa: BLE001 - delivered to the caller, as in mp
            # the chunk it interrupted is not run (as multiprocessing's imap): its
            # items never reached ``items``
            return items, True, exc
        return items, False, None

    def _run(self) -> None:
        # (an exception here is a bug of ours: fiber.threads logs it and calls _died)
        if type(self._iterable) in (list, tuple, range):
            error, ended = self._feed_sequence()
        else:
            error, ended = self._feed_iterator()
        sink = self._sink()
        if sink is not None:
            if error is not None:
                sink._fail_at(self._position, error)
            elif ended:
                sink._set_length(self._position)
        self._on_end(self)

    def _stopped(self) -> BaseException | None:
        """Why reading stops when :meth:`_room` says so (None: the iterator is gone)."""
        if self._scheduler.pool_state() == TERMINATE:
            return ValueError("the pool was terminated while this imap's input was "
                              "being read")
        return None

    def _feed_iterator(self) -> tuple[BaseException | None, bool]:
        """Read and submit the input through its iterator; returns (the error to
        deliver at the position reached, whether the input ended)."""
        error: BaseException | None = None
        ended = False
        try:
            assert self._iterable is not None
            it = iter(self._iterable)
            for first in it:  # its size sets the window
                self._item_bytes = pickled_size(first)
                it = itertools.chain((first,), it)
                break
        except Exception as exc:  # noqa: BLE001 - as multiprocessing: from next()
            it, ended, error = iter(()), True, exc
        self._iterable = None
        while not ended:
            chunks = self._room()
            if chunks is None:
                return self._stopped(), False
            items, ended, error = self._read(it, chunks)
            if items:
                error = self._submit(items) or error
                if error is not None:
                    ended = True
        return error, ended

    def _feed_sequence(self) -> tuple[BaseException | None, bool]:
        """:meth:`_feed_iterator` for a list, tuple or range: read by slices (reading
        them cannot fail or block; a range's chunks stay ranges, three numbers each)."""
        seq: Sequence[Any] = self._iterable  # type: ignore[assignment]
        self._iterable = None
        if len(seq):
            self._item_bytes = pickled_size(seq[0])
        while self._position < len(seq):
            chunks = self._room()
            if chunks is None:
                return self._stopped(), False
            error = self._submit(seq[self._position:
                                     self._position + chunks * self._chunksize])
            if error is not None:
                return error, True
        return None, True

    def _submit(self, items: Sequence[Any]) -> BaseException | None:
        size = self._chunksize
        count = len(items)
        # counted before the outcomes can arrive (they may, before submit returns)
        self._submitted += count
        try:
            with self._lock:
                self._scheduler.submit_chunks(self._func, items, size, self._kind,
                                              self._delivery, start=self._position,
                                              fed=True)
        except Exception as exc:  # noqa: BLE001 - the pool is broken or terminated
            self._submitted -= count
            return exc
        self._position += len(items)
        return None


def feed_ended(scheduler: Scheduler, lock: threading.RLock, feeders: set[Feeder],
               feed: Feeder) -> None:
    """A feeder's thread ends (the pool's callback: it holds the pool's parts, not the
    pool): it leaves the pool's ``feeders`` and the scheduler's count of feeders."""
    with lock:
        feeders.discard(feed)
        scheduler.feed_ended()
