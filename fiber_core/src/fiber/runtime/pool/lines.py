"""Hand a pool's lines to the pool without making the stream listener wait for its lock.

The stream listener's selector thread reads every connection of a hub: the pool's
lines, but also each job's control line, whose heartbeats (``WATCH``) keep the job
alive (:mod:`fiber.runtime.popen`). The pool's handlers run under the pool's lock,
which starter threads, ``stats()``, the feeder and the user's calls also take; a
selector thread that waited for it read nothing else meanwhile, and at thousands of
workers jobs went unread for the heartbeat timeout and were ended as lost (issue #29).

:class:`Handoff` runs a handler at once when the lock is free (the usual case: no
thread hop, nothing allocated); when it is busy, the selector thread queues the handler
and goes on reading, and a helper thread (``fiber-pool-lines``, started on demand,
gone once the queue is empty) runs the queue under the lock. Handlers run in the order
they were handed over: once one is queued, the next ones queue behind it (or run the
queue first, when they find the lock free). Any other thread (one that reads its own
connection while it waits for a result, :func:`~fiber.runtime.pool.channel.wait_directly`)
waits for the lock as before: its own result would otherwise be set behind its back.

If the helper thread dies, handing over falls back to waiting for the lock (as before
this module): nothing queued is lost, the dying thread runs what was queued.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from fiber import threads
from fiber.errors import FiberThreadError
from fiber.wire.stream.server import on_selector_thread

logger = logging.getLogger("fiber")

Handler = Callable[[], Callable[[], None] | None]
"""A handler runs under the lock; what it returns (if not None) is called after the
lock is released (the delivery of results to user callbacks)."""

class Handoff:
    """Runs handlers under ``lock`` in order, without blocking a shared reader."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._queue: collections.deque[Handler] = collections.deque()
        self._qlock = threading.Lock()
        self._helper: threading.Thread | None = None
        self._fallback = False  # the helper died: wait for the lock (see the module)
        self.queued = 0  # handlers that were queued (for tests and the bench)

    def run(self, handler: Callable[..., Callable[[], None] | None], *args: Any) -> None:
        """Run ``handler(*args)`` under the lock now, or queue it (on a shared reader
        whose lock is busy)."""
        lock = self._lock
        # (a free lock is taken without asking which thread this is)
        if self._queue or not (lock.acquire(False) or lock.acquire(
                blocking=not on_selector_thread() or self._fallback)):
            with self._qlock:
                self._queue.append(functools.partial(handler, *args) if args else handler)
                self.queued += 1
                if self._helper is None:
                    self._helper = threads.start("fiber-pool-lines", self._drain_all,
                                                 fails=self._helper_died)
            return
        after: list[Callable[[], None]] | None = None
        try:
            if self._queue:  # queued since it looked: what was queued comes first
                after = []
                self._drain(after)
            then = handler(*args)
        finally:
            lock.release()
        if after:
            for queued in after:
                queued()
        if then is not None:
            then()

    def _drain(self, after: list[Callable[[], None]]) -> None:
        """Run the queued handlers (the lock is held)."""
        queue = self._queue
        while queue:
            handler = queue.popleft()
            try:
                then = handler()
            except Exception:  # noqa: BLE001 - one bad line must not stop the others
                logger.exception("a pool line's handler failed")
                continue
            if then is not None:
                after.append(then)

    def _drain_all(self) -> None:
        """The helper thread: runs the queue until it is empty, then ends."""
        while True:
            after: list[Callable[[], None]] = []
            with self._lock:
                self._drain(after)
            for then in after:
                then()
            with self._qlock:
                if not self._queue:
                    self._helper = None
                    return

    def _helper_died(self, error: FiberThreadError) -> None:
        """Fall back to waiting for the lock; run what is queued (in the dying thread)."""
        self._fallback = True
        with self._qlock:
            self._helper = None
        after: list[Callable[[], None]] = []
        with self._lock:
            self._drain(after)
        for then in after:
            then()
