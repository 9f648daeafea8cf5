"""What a pool records for inspection (:meth:`fiber.Pool.stats`, ``fiber top``), at no
cost per task.

* **When each worker's task in progress began.** A worker runs its batch in order and
  its results come back as tasks finish, so the task in progress began when the
  worker's previous result arrived, or when it was given a batch while it held none.
  The pool's channel and the pending table stamp :attr:`Worker.since` then: one clock
  read per message, not per task. :func:`slowest` ranks the tasks in progress by it.
* **The last errors**, with their remote tracebacks (:func:`record_errors`, on the
  failure path only), in a bounded deque.
* **Throughput**: a :class:`Meter` takes at most one sample a second of the pool's
  finished-task count, when results arrive; :meth:`Meter.rate` is tasks per second
  over the last :data:`WINDOW` seconds.
* **Workers pending in the cluster's queue**: starting workers whose job the job
  monitor last saw ``PENDING`` (:func:`pending`).
* **Task times per function**: a histogram of powers of two (:func:`add_time`), one
  bucket added to per batch that ends, where the pending table already updates its
  moving mean (a batch's tasks count at the batch's mean time).
* **The last lost workers** (:func:`record_lost`, when a worker is lost), with the host
  and job they had.

Everything here is read under the pool's lock, like the rest of the pending table.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fiber.backend.job import JobState
from fiber.runtime import monitor

__all__ = ["ERRORS_KEPT", "FunctionTimes", "LostWorker", "Meter", "RunningTask",
           "TaskError", "WINDOW", "add_time", "errors_deque", "histogram", "in_progress",
           "lost_deque", "pending", "record_errors", "record_lost", "slowest"]

ERRORS_KEPT = 10  # failed tasks remembered per pool
SLOWEST_KEPT = 5  # tasks in progress a snapshot lists, longest running first
WINDOW = 10.0  # seconds over which throughput is measured
LOST_KEPT = 20  # lost workers remembered per pool
# task-time histogram: bucket i counts times in [2**(i + LOWEST), 2**(i + LOWEST + 1)) s,
# the first also those below, the last those above (about 1 us to 1 hour)
LOWEST = -20
BUCKETS = 33
_SAMPLE_EVERY = 1.0


@dataclass(frozen=True)
class RunningTask:
    """A task in progress, as :meth:`fiber.Pool.stats` saw it."""

    worker: int  # the worker's id in its pool
    task: str  # what it is: "item 12 (...)" of a map, "call with args=..." of an apply
    seconds: float  # how long it has been running (since its worker began it)


@dataclass(frozen=True)
class TaskError:
    """A task that failed, as :meth:`fiber.Pool.stats` keeps it."""

    time: float  # when its failure arrived (time.time())
    task: str
    error: str  # "TypeName: message"
    traceback: str  # the remote traceback ("" when the task did not raise in a worker)


@dataclass(frozen=True)
class LostWorker:
    """A worker that ended without being let go, as :meth:`fiber.Pool.stats` keeps it."""

    time: float  # when the pool saw it gone (time.time())
    worker: int  # its id in its pool
    job_id: str | None  # its job's id on the backend (None: it never had a job)
    host: str | None  # where it ran, when known
    # its fiber Process (for its job's log: ``fiber dashboard``), None if it had none
    process: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class FunctionTimes:
    """How long a function's tasks took (:attr:`fiber.PoolStats.functions`)."""

    name: str  # the function's qualified name
    tasks: int  # tasks measured
    mean: float  # their recent moving mean, seconds
    # counts per power of two of seconds: bucket i holds times from 2**(i + first) s
    buckets: tuple[int, ...]
    first: int = LOWEST


def add_time(hist: dict[int, list[int]], fid: int, seconds: float, count: int) -> None:
    """``count`` tasks of the function ``fid`` took ``seconds`` each."""
    counts = hist.get(fid)
    if counts is None:
        counts = hist[fid] = [0] * BUCKETS
    index = math.frexp(seconds)[1] - 1 - LOWEST if seconds > 0 else 0
    counts[min(max(index, 0), BUCKETS - 1)] += count


def histogram(name: str, mean: float | None, counts: list[int]) -> FunctionTimes:
    return FunctionTimes(name, sum(counts), round(mean or 0.0, 6), tuple(counts))


def lost_deque() -> collections.deque[LostWorker]:
    return collections.deque(maxlen=LOST_KEPT)


def record_lost(lost: collections.deque[LostWorker], wid: int, process: Any) -> None:
    """The worker ``wid`` (its fiber Process ``process``, or None) was lost."""
    job_id = host = None
    if process is not None:
        try:
            job_id, host = process.job_id, process.host
        except (AttributeError, ValueError):
            pass
    lost.append(LostWorker(time.time(), wid, job_id, host, process))


def errors_deque() -> collections.deque[TaskError]:
    return collections.deque(maxlen=ERRORS_KEPT)


def _remote_traceback(exc: BaseException) -> str:
    cause = exc.__cause__
    tb = getattr(cause, "tb", None)  # multiprocessing.pool.RemoteTraceback
    if isinstance(tb, str):
        return tb.strip().strip('"').strip("\n")
    return ""


def record_errors(errors: collections.deque[TaskError],
                  outcomes: Iterable[tuple[Any, bool, Any]]) -> None:
    """Remember the failures among ``outcomes`` (exceptions already unpacked)."""
    now = time.time()
    for task, ok, value in outcomes:
        if ok or not isinstance(value, BaseException):
            continue
        errors.append(TaskError(now, task.describe(), f"{type(value).__name__}: {value}",
                                _remote_traceback(value)))


class Meter:
    """Samples of a growing count, at most one a second, for a recent rate."""

    __slots__ = ("samples", "last")

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=int(WINDOW / _SAMPLE_EVERY) + 2)
        self.last = float("-inf")

    def tick(self, now: float, count: int) -> None:
        """The count is ``count`` at ``now`` (time.monotonic()); cheap when called often."""
        if now - self.last >= _SAMPLE_EVERY:
            self.last = now
            self.samples.append((now, count))

    def rate(self, count: int, now: float | None = None) -> float:
        """Units per second over the last :data:`WINDOW` seconds (0 before any sample)."""
        now = time.monotonic() if now is None else now
        base = None
        for t, c in self.samples:
            if now - t <= WINDOW:
                base = (t, c)
                break
        if base is None:
            if not self.samples:
                return 0.0
            base = self.samples[-1]
        elapsed = now - base[0]
        if elapsed <= 0.05:  # too short to say
            return 0.0
        return max(0, count - base[1]) / elapsed


def in_progress(workers: Iterable[Any]) -> int:
    """How many tasks are in progress: one per worker whose running batch has a task
    without a result (a worker runs its tasks one at a time; the others it holds,
    those of its batch and of the batch it holds in advance, are waiting)."""
    count = 0
    for w in workers:
        if w.order and w.held.get(w.order[0]):
            count += 1
    return count


def slowest(workers: Iterable[Any], now: float | None = None) -> tuple[RunningTask, ...]:
    """The tasks in progress (the first task without a result of each worker's running
    batch), longest running first, at most :data:`SLOWEST_KEPT`."""
    now = time.monotonic() if now is None else now
    found = []
    for w in workers:
        if not w.order:
            continue
        batch = w.held.get(w.order[0])
        if batch:
            found.append((now - w.since, w.id, next(iter(batch.values()))))
    found.sort(key=lambda entry: -entry[0])
    return tuple(RunningTask(wid, task.describe(), round(seconds, 3))
                 for seconds, wid, task in found[:SLOWEST_KEPT])


def pending(processes: Iterable[Any]) -> int:
    """How many of these workers' jobs the cluster last reported ``PENDING`` (queued,
    pulling an image, being scheduled)."""
    count = 0
    for process in processes:
        job_id = getattr(process, "job_id", None) if process is not None else None
        if job_id is not None and monitor.last_state(job_id) is JobState.PENDING:
            count += 1
    return count
