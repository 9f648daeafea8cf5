"""The end of a pool's workers: closing the pool's channels, then ending the workers'
jobs in bulk with bounded waits (:func:`terminate_workers`), and the end of a pool that
was never terminated (:func:`end_pool`: at exit or when it is garbage collected). The
worker set (:mod:`~fiber.runtime.pool.workers`) calls these; they hold nothing of it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from fiber.runtime import teardown
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import settle
from fiber.wire import transport

#: seconds terminate_workers waits for the workers to exit, before and after forcing
END_JOIN_WAIT = 5.0


class WorkerProcess(Protocol):
    """What the worker set needs of a worker's process (a :class:`fiber.Process`)."""

    _popen: Any

    @property
    def exitcode(self) -> int | None: ...

    def start(self) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


def terminate_workers(processes: list[WorkerProcess], hub: transport.Hub | None,
                      cid: int, channels: Sequence[tuple[transport.Hub, int]] = ()) -> None:
    """End ``processes`` after closing the pool's channel ``cid``: their jobs in bulk
    (one call per backend), then a bounded wait, a forced end of those still running
    and another bounded wait. A cluster that does not answer is asked again in the
    background (:mod:`fiber.runtime.teardown`), so this returns within seconds."""
    if hub is not None:
        hub.remove_channel(cid)  # connected workers leave on their own
        for other, other_cid in channels:  # the pool's channels on other placements' hubs
            other.remove_channel(other_cid)
    teardown.end_and_wait(list(processes), END_JOIN_WAIT)


def end_pool(scheduler: Scheduler, changed: threading.Condition,
             processes: list[WorkerProcess], hub: transport.Hub | None, cid: int,
             channels: list[tuple[transport.Hub, int]]) -> None:
    """The end of a pool that was not terminated before (at exit, or when it is
    garbage collected), as terminate(): what is pending fails, the workers end."""
    with changed:
        failed = scheduler.terminate()
    if failed:
        settle(failed)
    terminate_workers(processes, hub, cid, channels)
