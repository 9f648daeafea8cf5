"""The driver of an adaptive pool (:meth:`fiber.Pool.adapt`): every :data:`TICK`
seconds it takes a snapshot of the pool under its lock, asks the policy
(:mod:`~fiber.runtime.pool.adapt_policy`) what to do, and does it through the machinery
``resize`` uses, in the same hold of the lock (so a worker seen idle cannot be handed
a batch before it is let go):

* **start**: the pool's target size (:attr:`Scheduler.target`) goes up; the worker
  set's supervisor starts the missing workers, as for ``resize``;
* **give back** an idle worker: :meth:`WorkerSet.retire_worker`, as ``resize`` lets a
  worker go; it holds no batch (it is idle, and the lock is held), so its parked lines
  are answered STOP at once and it exits;
* **cancel** a job still pending in the cluster: the same call, which ends a job that
  has not connected.

The target then is the workers the pool keeps plus those it starts, so the supervisor
never starts one on its own. A worker lost while adapting lowers the target
(:attr:`Scheduler.adaptive`, in ``Scheduler.lose``): it is replaced only if the next
decision still wants it.

The driver holds its pool's parts only weakly between ticks (the pool can be collected),
runs on a ``fiber-pool-adapt`` thread (:mod:`fiber.threads`: its death breaks the pool,
so calls raise rather than wait for workers nobody starts), and stops when adapting is
turned off (``resize``), when the pool is terminated or collected, or once a closed
pool has nothing left to run.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fiber import threads
from fiber.backend.job import JobState
from fiber.runtime import monitor
from fiber.runtime.pool import adapt_policy
from fiber.runtime.pool.adapt_policy import Decision, Settings, Snapshot, WorkerView
from fiber.runtime.pool.scheduler import CLOSE, TERMINATE, Scheduler, Worker

if TYPE_CHECKING:
    from fiber.runtime.pool.workers import WorkerSet

__all__ = ["AdaptStats", "Adapter", "DECISIONS_KEPT", "TICK"]

logger = logging.getLogger("fiber")

TICK = 0.1  # seconds between two snapshots
DECISIONS_KEPT = 10  # the last decisions that changed something, kept for stats()


@dataclass(frozen=True)
class AdaptStats:
    """An adaptive pool's state, in :attr:`fiber.PoolStats.adapt`."""

    minimum: int
    maximum: int
    idle_timeout: float
    growth: float
    wanted: int  # the size the last decision aimed for
    # the last decisions that started, gave back or cancelled workers, oldest first:
    # (time.time(), reason)
    decisions: tuple[tuple[float, str], ...]


class Adapter:
    """The driver of one pool's adaptation (see the module). ``changed`` is the
    condition, on the pool's lock, that the pending table notifies."""

    def __init__(self, scheduler: Scheduler, changed: threading.Condition,
                 worker_set: WorkerSet, settings: Settings) -> None:
        self._scheduler = scheduler
        self._changed = changed
        self._workers = worker_set
        self.settings = settings
        self.active = True
        self.wanted = scheduler.target
        self._idle_since: dict[int, float] = {}
        self.decisions: collections.deque[tuple[float, str]] = collections.deque(
            maxlen=DECISIONS_KEPT)
        scheduler.adaptive = True
        ref = weakref.ref(worker_set)
        self.thread = threads.start("fiber-pool-adapt", Adapter._drive, weakref.ref(self),
                                    changed, fails=lambda error: Adapter._died(ref, error))

    def stop(self) -> None:
        """Adapting ends (the lock is held): the pool keeps its size from now on."""
        self.active = False
        self._scheduler.adaptive = False
        self._changed.notify_all()

    def update(self, settings: Settings) -> None:
        """New settings, from the next tick on (the lock is held)."""
        self.settings = settings
        self._changed.notify_all()

    def stats(self) -> AdaptStats:
        """The adapt part of :meth:`fiber.Pool.stats` (the lock is held)."""
        cfg = self.settings
        return AdaptStats(cfg.minimum, cfg.maximum, cfg.idle_timeout, cfg.growth,
                          self.wanted, tuple(self.decisions))

    # -- the thread -----------------------------------------------------------------
    @staticmethod
    def _drive(ref: weakref.ref[Adapter], changed: threading.Condition) -> None:
        while True:
            with changed:
                adapter = ref()
                if adapter is None or not adapter._tick():
                    return
                del adapter
                changed.wait(TICK)

    @staticmethod
    def _died(ref: weakref.ref[WorkerSet], error: BaseException) -> None:
        """Nothing adapts the pool any more (it may have no worker, and will not get
        one): the pool is broken, its waiting results fail with ``error``."""
        workers = ref()
        if workers is not None:
            workers.break_pool(error)

    def _tick(self) -> bool:
        """One round (the lock is held); False when adapting is over."""
        s = self._scheduler
        if not self.active or s.state == TERMINATE or s.broken is not None \
                or not self._workers.alive():
            return False
        if s.state == CLOSE and not s.unfinished():
            return False  # closed and done: the workers are let go by close()
        snap, kept = self.snapshot(time.monotonic())
        decision = adapt_policy.decide(snap)
        self.apply(decision, kept)
        return True

    def snapshot(self, now: float) -> tuple[Snapshot, dict[int, Worker]]:
        """The policy's view of the pool, and the workers it counts by id."""
        s = self._scheduler
        views = []
        kept = {}
        since = self._idle_since
        for w in s.workers.values():
            if not w.alive or w.stopping:
                continue
            kept[w.id] = w
            if not w.connected:
                state = adapt_policy.PENDING if _pending(w) else adapt_policy.STARTING
            elif w.held or w.recalling:
                state = adapt_policy.BUSY
            else:
                state = adapt_policy.IDLE
            if state == adapt_policy.IDLE:
                views.append(WorkerView(w.id, state, since.setdefault(w.id, now)))
            else:
                since.pop(w.id, None)
                views.append(WorkerView(w.id, state))
        for wid in [wid for wid in since if wid not in kept]:
            del since[wid]
        running = sum(len(w.running()) for w in kept.values())
        snap = Snapshot(now, len(s.queue), running, tuple(views), self.settings,
                        s.task_seconds)
        return snap, kept

    def apply(self, decision: Decision, kept: dict[int, Worker]) -> None:
        """Do what ``decision`` says (the lock is held, as when the snapshot was taken)."""
        s = self._scheduler
        self.wanted = decision.wanted
        gone = decision.retire + decision.cancel
        s.target = len(kept) + decision.start - len(gone)
        for wid in gone:
            w = kept[wid]
            assert not w.held, f"the adapt policy gave back pool worker {wid}, which holds tasks"
            self._workers.retire_worker(w)
            self._idle_since.pop(wid, None)
        if decision.changes:
            self.decisions.append((time.time(), decision.reason))
            logger.info("adaptive pool: %s", decision.reason)
            self._changed.notify_all()  # the supervisor starts what is wanted


def _pending(w: Worker) -> bool:
    """Whether ``w``'s job is queued by the cluster (not running yet)."""
    job_id = getattr(w.process, "job_id", None) if w.process is not None else None
    return job_id is not None and monitor.last_state(job_id) is JobState.PENDING
