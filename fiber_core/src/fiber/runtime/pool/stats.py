"""What :meth:`fiber.Pool.stats` returns, and its assembly from the pending table.

:class:`PoolStats` (with a :class:`WorkerStats` per worker) is a frozen snapshot;
:func:`snapshot` builds it in one pass over the workers (not over the tasks), under the
pool's lock, which its caller holds. Both classes are public as ``fiber.PoolStats`` and
``fiber.pool.WorkerStats``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fiber.runtime.pool import observe
from fiber.runtime.pool.observe import FunctionTimes, LostWorker, RunningTask, TaskError
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import BUSY, IDLE, STARTING, STOPPING

if TYPE_CHECKING:  # adapt.py is loaded by the first Pool.adapt()
    from fiber.runtime.pool.adapt import AdaptStats

__all__ = ["PoolStats", "WorkerStats", "snapshot"]


@dataclass(frozen=True)
class WorkerStats:
    """One worker of a pool, as :meth:`Pool.stats` saw it."""

    id: int  # the worker's number in its pool (its process is named PoolWorker-<id>)
    state: str  # "starting", "idle", "busy" or "stopping"
    process: Any  # its fiber Process; None while its job is being started
    batches: int  # batches it holds: 0, 1, or 2 when it took one in advance
    held: int  # tasks in those batches
    dispatched: int  # tasks sent to it so far
    since: float = 0.0  # when it was asked for (time.time())
    placement: str = ""  # the name of the placement it was started in (Pool.adapt)


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool (:meth:`Pool.stats`).

    A task is one ``apply`` call or one chunk of a map; a chunk that was running when
    its worker was lost runs again as single items, which count as tasks of their own.
    Workers are counted by state: ``starting`` (its job is starting, or it has not
    connected yet; ``pending`` of them are queued by the cluster), ``idle``, ``busy``
    (holds tasks), ``stopping`` (let go by ``resize``, ``maxtasksperchild`` or
    ``close``, and not yet gone). ``slowest`` and ``errors`` (with remote tracebacks)
    are what ``fiber top`` shows (:mod:`fiber.runtime.pool.observe`).
    """

    state: str  # "RUN", "CLOSE" or "TERMINATE"
    processes: int  # the size the pool aims for
    starting: int
    idle: int
    busy: int
    stopping: int
    started: int  # workers started over the pool's life
    lost: int  # workers that ended without being let go (died, killed, lost their host)
    replaced: int  # workers started to make up for lost ones
    queued: int  # tasks waiting for a worker
    running: int  # tasks in progress: one per worker running a task
    # (a worker runs its batch one task at a time; the rest of the batch is ``held``)
    held: int  # tasks held by workers: running, or taken in advance
    done: int  # tasks finished with a value
    failed: int  # tasks finished with an error (raised, lost workers, terminate)
    workers: tuple[WorkerStats, ...]
    pending: int = 0  # of the starting workers, those whose job the cluster queues
    throughput: float = 0.0  # tasks finished per second over the last 10 s
    slowest: tuple[RunningTask, ...] = ()  # tasks in progress, longest running first
    errors: tuple[TaskError, ...] = ()  # the last failed tasks, oldest first
    # tasks a worker gave back unstarted, for a worker with nothing to do (work stealing)
    recalled: int = 0
    adapt: AdaptStats | None = None  # the adaptive pool's state (None: not adapting)
    # the recent tasks' running time, seconds (a moving mean; None before any result)
    task_seconds: float | None = None
    # how long each function's tasks took lately, a histogram per function
    functions: tuple[FunctionTimes, ...] = ()
    recently_lost: tuple[LostWorker, ...] = ()  # the last lost workers, oldest first
    # why workers cannot be started, once the pool broke (every call raises it); None
    broken: BaseException | None = None


def snapshot(s: Scheduler, adapt: AdaptStats | None,
             placement: Callable[[int], str] | None = None) -> PoolStats:
    """The pool of the pending table ``s`` now (call with the pool's lock held);
    ``adapt``: the adaptive pool's state, if it adapts; ``placement``: the name of a
    worker's placement, by its id."""
    workers = tuple(
        WorkerStats(w.id, w.state, w.process, len(w.held),
                    sum(len(batch) for batch in w.held.values()), w.dispatched, w.born,
                    "" if placement is None else placement(w.id))
        for w in s.workers.values())
    states = [ws.state for ws in workers]
    now = time.monotonic()
    return PoolStats(
        state=s.state, processes=s.target,
        starting=states.count(STARTING), idle=states.count(IDLE),
        busy=states.count(BUSY), stopping=states.count(STOPPING),
        started=s.started, lost=s.lost_workers, replaced=s.replaced,
        queued=len(s.queue),
        running=observe.in_progress(s.workers.values()),
        held=sum(ws.held for ws in workers), done=s.done, failed=s.failed,
        workers=workers,
        pending=observe.pending(ws.process for ws in workers if ws.state == STARTING),
        throughput=s.meter.rate(s.done + s.failed, now),
        slowest=observe.slowest(s.workers.values(), now), errors=tuple(s.errors),
        recalled=s.recalled, task_seconds=s.task_seconds, adapt=adapt,
        functions=tuple(observe.histogram(s.func_name(fid), s.fid_seconds.get(fid), counts)
                        for fid, counts in sorted(s.fid_hist.items())),
        recently_lost=tuple(s.lost_log), broken=s.failure())
