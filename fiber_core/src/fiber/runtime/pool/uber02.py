"""uber/fiber 0.2's Pool methods, deprecated (docs/multiprocessing.md, "uber/fiber
0.2 programs"): a base class of :class:`fiber.Pool`, so that the class itself holds
multiprocessing's API and fiber's own extensions only."""

from __future__ import annotations

import time
from typing import Any

from fiber import util
from fiber.errors import TimeoutError

__all__ = ["Uber02Methods"]


class Uber02Methods:
    """``wait_until_workers_up`` and ``start_workers`` of uber/fiber 0.2's pools, over
    the pool's lock, pending table and :meth:`stats`."""

    _lock: Any
    _scheduler: Any

    def stats(self) -> Any:  # (the pool's)
        raise NotImplementedError

    def wait_until_workers_up(self, timeout: float | None = None) -> None:
        """Deprecated (uber/fiber 0.2): wait until every worker of the pool has started
        and connected (``TimeoutError`` after ``timeout`` seconds; the pool's error if
        it breaks). Tasks need no such wait: they go to the first workers that are up;
        to watch the workers start, poll :meth:`stats` (``starting`` falls to 0)."""
        util.warn_deprecated(
            "Pool.wait_until_workers_up",
            "Pool.wait_until_workers_up() is deprecated: tasks go to the first workers "
            "that are up; to watch workers start, poll Pool.stats().starting")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                broken = self._scheduler.failure()
                stats = self.stats()
            if broken is not None:
                raise broken
            if stats.starting == 0 and stats.idle + stats.busy >= stats.processes:
                return
            if stats.state != "RUN":
                raise ValueError("Pool not running")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{stats.starting} of the pool's {stats.processes} "
                                   "workers are still starting")
            time.sleep(0.02)

    def start_workers(self) -> None:
        """Deprecated (uber/fiber 0.2) and not needed: workers start when the pool is
        created (and are replaced when lost). Does nothing."""
        util.warn_deprecated(
            "Pool.start_workers",
            "Pool.start_workers() is deprecated and does nothing: a fiber Pool starts "
            "its workers when it is created")

