"""Deadlines on one thread: the hub's own timeouts (a parked request's wait, a
connection's time to authenticate) and the parent's heartbeat checks run here, so a
reply and its timeout are decided on the hub's side, never both. If the thread dies,
each deadline pending is failed at once with the thread's error (its ``failed``
callback; one given none is run, as an early timeout), and :meth:`Timers.call_at`
raises that error from then on (:mod:`fiber.threads`)."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable

from fiber import threads
from fiber.errors import FiberThreadError

__all__ = ["Timers"]

logger = logging.getLogger("fiber")

_LONGEST_WAIT = 86400.0  # seconds; far below threading.TIMEOUT_MAX

_Failed = Callable[[FiberThreadError], None]


class Timers:
    """A thread, started on first use, that runs callbacks at deadlines."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None], _Failed | None]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._error: FiberThreadError | None = None

    def call_at(self, deadline: float, fn: Callable[[], None],
                failed: _Failed | None = None) -> None:
        """Run ``fn()`` at ``deadline`` (a :func:`time.monotonic` time); should the
        thread die first, ``failed(error)`` is called instead (``fn()`` when None).
        Raises :class:`~fiber.errors.FiberThreadError` once the thread has died."""
        if math.isnan(deadline):  # (a peer's timeout of NaN: never, as float("inf"))
            deadline = math.inf
        with self._cond:
            if self._error is not None:
                raise self._error
            heapq.heappush(self._heap, (deadline, next(self._counter), fn, failed))
            if self._thread is None:
                self._thread = threads.start("fiber-timers", self._run, fails=self._died)
            self._cond.notify()

    def call_later(self, delay: float, fn: Callable[[], None],
                   failed: _Failed | None = None) -> None:
        """Run ``fn()`` in ``delay`` seconds (see :meth:`call_at`)."""
        self.call_at(time.monotonic() + delay, fn, failed)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    # (a far deadline, e.g. a timeout of 1e300 in a request: a wait that
                    # long raises OverflowError, so it is waited for a day at a time)
                    self._cond.wait(None if wait is None else min(wait, _LONGEST_WAIT))
                if self._closed:
                    return
                _, _, fn, _ = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a timer must not kill the thread
                logger.exception("fiber timer callback failed")

    def _died(self, error: FiberThreadError) -> None:
        """The thread died: every deadline still pending is failed with ``error`` now
        (its waiter's call raises it rather than wait for ever), or, given no
        ``failed``, run now (a timeout early rather than never), and :meth:`call_at`
        raises ``error`` from now on."""
        with self._cond:
            self._error = error
            pending, self._heap = self._heap, []
        for _, _, fn, failed in sorted(pending, key=lambda entry: entry[:2]):
            try:
                if failed is not None:
                    failed(error)
                else:
                    fn()
            except Exception:  # noqa: BLE001
                logger.exception("fiber timer callback failed")

    def close(self) -> None:
        """Stop the thread; callbacks not run yet are dropped."""
        with self._cond:
            self._closed = True
            self._cond.notify()
