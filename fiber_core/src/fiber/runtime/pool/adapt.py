"""The driver of an adaptive pool (:meth:`fiber.Pool.adapt`): every :data:`TICK`
seconds it takes a snapshot of the pool under its lock, asks the policy
(:mod:`~fiber.runtime.pool.adapt_policy`) what to do, and does it through the machinery
``resize`` uses, in the same hold of the lock (so a worker seen idle cannot be handed
a batch before it is let go):

* **start**: the pool's target size (:meth:`Scheduler.set_size`) goes up; the worker
  set's supervisor starts the missing workers, as for ``resize``;
* **give back** an idle worker: :meth:`WorkerSet.retire_worker`, as ``resize`` lets a
  worker go; it holds no batch (it is idle, and the lock is held), so its parked lines
  are answered STOP at once and it exits;
* **cancel** a job still pending in the cluster: the same call, which ends a job that
  has not connected.

The target then is the workers the pool keeps plus those it starts, so the supervisor
never starts one on its own, except the replacement of a worker let go after
``maxtasksperchild``, which goes where the policy would start one
(:func:`adapt_policy.replacement`, through ``WorkerSet.place_next``). A worker lost
while adapting lowers the target (:meth:`Scheduler.set_adaptive`, in ``Scheduler.lose``):
it is replaced only if the next decision still wants it.

Placements (``adapt(placements=...)``): each worker counts in its placement
(:attr:`WorkerSet.placement_of`); the decision's ``placed`` becomes the worker set's
``to_place``, which the supervisor follows. A placement *fails* when a start there
raises, a job there ends before its worker connects (both reported by the worker set),
or a start there has been under way :data:`STALL` seconds without a job (its cluster
does not answer); it is then skipped until its :func:`~adapt_policy.backoff` is over,
with one warning on the ``fiber`` logger when it begins to be skipped (further failures
in a row are logged at debug) and one info line once a worker of it connects again.
Once every placement has failed :data:`GIVE_UP_FAILURES` times in a row while tasks
wait and the pool has no worker, the pool breaks with a ``ProcessStartError`` naming
each placement's last failure (its tasks fail rather than wait for ever).

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
from fiber.errors import ProcessStartError
from fiber.runtime import monitor
from fiber.runtime.pool import adapt_policy
from fiber.runtime.pool.adapt_policy import Decision, Settings, Snapshot, WorkerView
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import CLOSE, TERMINATE, Worker

if TYPE_CHECKING:
    from fiber.runtime.pool.workers import WorkerSet

__all__ = ["AdaptStats", "Adapter", "DECISIONS_KEPT", "GIVE_UP_FAILURES", "PlacementStats",
           "STALL", "TICK"]

logger = logging.getLogger("fiber")

TICK = 0.1  # seconds between two snapshots
#: seconds a start may be under way without a job before its placement is skipped
STALL = 5.0
#: failures in a row of every placement, with no worker and tasks queued, that break
#: the pool (its tasks fail with ProcessStartError rather than wait)
GIVE_UP_FAILURES = 3
DECISIONS_KEPT = 10  # the last decisions that changed something, kept for stats()


@dataclass(frozen=True)
class PlacementStats:
    """One placement of an adaptive pool, in :attr:`AdaptStats.placements`."""

    name: str  # the context's backend (and overrides)
    maximum: int
    wanted: int  # the workers the last decision aimed for there
    pending: int  # jobs the cluster still queues
    starting: int  # started, not connected yet
    busy: int
    idle: int
    skipped: float  # seconds until it is tried again (0: not skipped)


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
    placements: tuple[PlacementStats, ...] = ()  # each placement's workers, in order


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
        self.wanted = scheduler.size()
        n = len(settings.caps())
        self._retry_at = [0.0] * n  # per placement: skipped until then (monotonic)
        self._failures = [0] * n  # per placement: failures in a row
        self._placed_wanted = [0] * n
        self._views: tuple[WorkerView, ...] = ()
        self._connected: set[int] = set()  # workers seen connected
        self._why = [""] * n  # per placement: its last failure
        # the pool's error once every placement failed GIVE_UP_FAILURES times in a row
        self.failed: ProcessStartError | None = None
        worker_set.on_failure = self._failed if settings.placements else None
        worker_set.place_next = self._place_next if settings.placements else None
        self._idle_since: dict[int, float] = {}
        self.decisions: collections.deque[tuple[float, str]] = collections.deque(
            maxlen=DECISIONS_KEPT)
        scheduler.set_adaptive(True)
        ref = weakref.ref(worker_set)
        self.thread = threads.start("fiber-pool-adapt", Adapter._drive, weakref.ref(self),
                                    changed, fails=lambda error: Adapter._died(ref, error))

    def stop(self) -> None:
        """Adapting ends (the lock is held): the pool keeps its size from now on."""
        self.active = False
        self._scheduler.set_adaptive(False)
        self._workers.on_failure = None
        self._workers.place_next = None
        self._changed.notify_all()

    def update(self, settings: Settings) -> None:
        """New settings, from the next tick on (the lock is held)."""
        n = len(settings.caps())
        if n != len(self.settings.caps()) or settings.placements != self.settings.placements:
            self._retry_at = [0.0] * n
            self._failures = [0] * n
            self._placed_wanted = [0] * n
            self._why = [""] * n
        self.settings = settings
        self._workers.on_failure = self._failed if settings.placements else None
        self._workers.place_next = self._place_next if settings.placements else None
        self._changed.notify_all()

    def stats(self) -> AdaptStats:
        """The adapt part of :meth:`fiber.Pool.stats` (the lock is held)."""
        cfg = self.settings
        now = time.monotonic()
        places = []
        if cfg.placements:
            for i, cap in enumerate(cfg.caps()):
                views = [w for w in self._views if w.placement == i]
                count = collections.Counter(w.state for w in views)
                places.append(PlacementStats(
                    self._workers.placement(i).name, cap, self._placed_wanted[i],
                    count[adapt_policy.PENDING], count[adapt_policy.STARTING],
                    count[adapt_policy.BUSY], count[adapt_policy.IDLE],
                    round(max(0.0, self._retry_at[i] - now), 1)))
        return AdaptStats(cfg.minimum, cfg.maximum, cfg.idle_timeout, cfg.growth,
                          self.wanted, tuple(self.decisions), tuple(places))

    def _place_next(self, held: list[int]) -> int:
        """The placement of a worker the supervisor starts without a decision (the
        replacement of one that reached maxtasksperchild; the lock is held): where a
        decision would start it (:func:`adapt_policy.replacement`)."""
        return adapt_policy.replacement(self.settings, held, tuple(self._retry_at),
                                        time.monotonic())

    def _failed(self, placement: int, why: str) -> None:
        """A start in ``placement`` failed (the lock is held): skip it a while."""
        if placement >= len(self._failures):
            return
        now = time.monotonic()
        if now < self._retry_at[placement]:
            return  # already skipped (another start of the same round)
        self._failures[placement] += 1
        self._why[placement] = why
        wait = adapt_policy.backoff(self._failures[placement])
        self._retry_at[placement] = now + wait
        name = self._workers.placement(placement).name
        if self._failures[placement] == 1:
            logger.warning("adaptive pool: placement %d (%s) skipped: %s; the other "
                           "placements carry on, it is tried again in %.0f s, then "
                           "less often while it fails", placement, name, why, wait)
        else:
            logger.debug("adaptive pool: placement %d (%s) failed again (%s); tried "
                         "again in %.0f s", placement, name, why, wait)

    # -- the thread -----------------------------------------------------------------
    @staticmethod
    def _drive(ref: weakref.ref[Adapter], changed: threading.Condition) -> None:
        while True:
            with changed:
                adapter = ref()
                if adapter is None:
                    return
                if not adapter._tick():
                    failed, workers = adapter.failed, adapter._workers
                    break
                del adapter
                changed.wait(TICK)
        del adapter
        if failed is not None:  # every placement fails: the pool breaks (not under the lock)
            workers.break_pool(failed)

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
        if not self.active or s.pool_state() == TERMINATE or s.failure() is not None \
                or not self._workers.alive():
            return False
        if s.pool_state() == CLOSE and not s.unfinished():
            return False  # closed and done: the workers are let go by close()
        now = time.monotonic()
        if self.settings.placements:
            self._check_stalls(now)
        snap, kept = self.snapshot(now)
        if self.settings.placements and snap.queued and not snap.workers and all(
                f >= GIVE_UP_FAILURES for f in self._failures):
            self.failed = ProcessStartError(
                f"every placement of the adaptive pool failed {GIVE_UP_FAILURES} times in "
                "a row and the pool has no worker for its tasks: " + "; ".join(
                    f"placement {i} ({self._workers.placement(i).name}): {why}"
                    for i, why in enumerate(self._why))
                + ". Check those clusters (fiber's log says when each began to fail), "
                "then make a new pool")
            logger.error("adaptive pool: %s", self.failed)
            return False
        decision = adapt_policy.decide(snap)
        self.apply(decision, kept)
        return True

    def _check_stalls(self, now: float) -> None:
        """A start under way for :data:`STALL` s without a job fails its placement."""
        ws = self._workers
        for wid, began in list(ws.start_began.items()):
            if now - began >= STALL:
                place = ws.placement_of.get(wid, 0)
                if place < len(self._retry_at) and now >= self._retry_at[place]:
                    self._failed(place, f"a job was not created within {STALL:g} s "
                                        "(the cluster does not answer)")
                    for other, other_began in ws.start_began.items():
                        if ws.placement_of.get(other, 0) == place:
                            ws.start_began[other] = max(other_began, now)  # counted once

    def snapshot(self, now: float) -> tuple[Snapshot, dict[int, Worker]]:
        """The policy's view of the pool, and the workers it counts by id."""
        s = self._scheduler
        views = []
        kept = {}
        since = self._idle_since
        placement_of = self._workers.placement_of
        places = len(self.settings.caps())
        for w in s.alive_workers():
            if not w.alive or w.stopping:
                continue
            kept[w.id] = w
            if not w.connected:
                state = adapt_policy.PENDING if _pending(w) else adapt_policy.STARTING
            elif w.held or w.recalling:
                state = adapt_policy.BUSY
            else:
                state = adapt_policy.IDLE
            place = placement_of.get(w.id, 0)
            if state == adapt_policy.IDLE:
                views.append(WorkerView(w.id, state, since.setdefault(w.id, now), place))
            else:
                since.pop(w.id, None)
                views.append(WorkerView(w.id, state, None, place))
            if w.connected and w.id not in self._connected:
                self._connected.add(w.id)  # newly connected: its placement works
                if place < places and self._failures[place]:
                    self._failures[place] = 0
                    self._retry_at[place] = 0.0
                    logger.info("adaptive pool: placement %d (%s) works again", place,
                                self._workers.placement(place).name)
        for wid in [wid for wid in since if wid not in kept]:
            del since[wid]
        self._connected &= kept.keys()
        running = sum(len(w.running()) for w in kept.values())
        self._views = tuple(views)
        snap = Snapshot(now, s.queued(), running, self._views, self.settings,
                        s.task_time(), tuple(self._retry_at))
        return snap, kept

    def apply(self, decision: Decision, kept: dict[int, Worker]) -> None:
        """Do what ``decision`` says (the lock is held, as when the snapshot was taken)."""
        s = self._scheduler
        self.wanted = decision.wanted
        gone = decision.retire + decision.cancel
        s.set_size(len(kept) + decision.start - len(gone))
        # where the workers started next go (replaced each tick: the supervisor may
        # not have taken the last ones yet, and then they are decided again)
        self._workers.to_place = [i for i, n in enumerate(decision.placed) for _ in range(n)]
        if self.settings.placements:
            placed = [0] * len(self._placed_wanted)
            for view in self._views:
                if view.placement < len(placed) and view.id not in gone:
                    placed[view.placement] += 1
            for i, n in enumerate(decision.placed):
                placed[i] += n
            self._placed_wanted = placed
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
