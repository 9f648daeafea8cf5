"""The policy of an adaptive pool (:meth:`fiber.Pool.adapt`): a pure function from a
snapshot of the pool to a decision.

No clock, no lock, no process: the driver (:mod:`~fiber.runtime.pool.adapt`) takes a
:class:`Snapshot` under the pool's lock, calls :func:`decide` and applies the
:class:`Decision`; unit tests call :func:`decide` with snapshots they make, and a clock
of their own.

The rules, in order:

* **Demand** is the workers that would have work now: the busy ones plus one per queued
  task. The pool **wants** that many, bounded by ``minimum`` and ``maximum``.
* **Coming counts.** A worker whose job is queued by the cluster (``pending``) or has
  started but not connected (``starting``) counts as one the pool has, so a long
  cluster queue is never answered by submitting more jobs.
* **Growing** starts the difference between what is wanted and what the pool has, at
  most so that the workers coming at once are ``max(STARTING_FLOOR, growth * up)``
  (``up``: connected workers): a pool of 4 may have 8 more coming with ``growth=2``.
  Workers below ``minimum`` are started regardless of that cap.
* **Shrinking**, when the pool has more than it wants: first jobs still pending in the
  cluster are cancelled (newest first; they cost a place in the queue, not a
  worker), then idle workers are given back, the longest idle first, once idle for
  ``idle_timeout`` seconds, or at once if the pool is above ``maximum``. A busy
  worker is never given back, nor one still starting (it connects, idles, and times
  out), and the pool never goes below ``minimum`` by a decision.

``task_seconds`` is in the snapshot (and the stats) but no rule uses it yet: a rule
that skips starting a worker for a queue that drains before the worker would be up
needs the backend's start time, which the pool does not measure yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BUSY", "IDLE", "PENDING", "STARTING", "STARTING_FLOOR", "Decision", "Settings",
           "Snapshot", "WorkerView", "decide"]

PENDING, STARTING, BUSY, IDLE = "pending", "starting", "busy", "idle"
#: workers that may be coming at once however few are up (growth multiplies the rest)
STARTING_FLOOR = 4


@dataclass(frozen=True)
class Settings:
    """The knobs of :meth:`fiber.Pool.adapt` (checked there)."""

    minimum: int = 0
    maximum: int = 1
    idle_timeout: float = 30.0  # seconds a worker may stay idle before it is given back
    growth: float = 2.0  # workers coming at once, as a multiple of the workers up


@dataclass(frozen=True)
class WorkerView:
    """One worker the pool still counts (not one being let go)."""

    id: int
    state: str  # PENDING (queued by the cluster), STARTING, BUSY or IDLE
    idle_since: float | None = None  # when it last became idle (IDLE only), on the clock


@dataclass(frozen=True)
class Snapshot:
    """What the policy sees of a pool at ``now`` (seconds of any monotonic clock)."""

    now: float
    queued: int  # tasks waiting for a worker
    running: int  # tasks workers are running
    workers: tuple[WorkerView, ...]
    settings: Settings
    task_seconds: float | None = None  # a task's recent duration (None: not measured)

    def count(self, state: str) -> int:
        return sum(1 for w in self.workers if w.state == state)


@dataclass(frozen=True)
class Decision:
    """What to do: ``start`` new workers, give back the idle workers ``retire``,
    cancel the pending jobs of ``cancel``; ``wanted`` is the size aimed for and
    ``reason`` says why in one line."""

    start: int
    retire: tuple[int, ...]
    cancel: tuple[int, ...]
    wanted: int
    reason: str

    @property
    def changes(self) -> bool:
        return bool(self.start or self.retire or self.cancel)


def decide(snap: Snapshot) -> Decision:
    """The decision for ``snap`` (see the module's docstring for the rules)."""
    cfg = snap.settings
    busy, idle = snap.count(BUSY), snap.count(IDLE)
    pending, starting = snap.count(PENDING), snap.count(STARTING)
    up = busy + idle
    coming = pending + starting
    have = up + coming
    wanted = min(cfg.maximum, max(cfg.minimum, busy + snap.queued))
    state = (f"{snap.queued} queued, {busy} busy, {idle} idle, {coming} coming; "
             f"wanted {wanted} in [{cfg.minimum}, {cfg.maximum}]")
    if have < wanted:
        below_minimum = max(0, cfg.minimum - have)
        cap = max(STARTING_FLOOR, math.ceil(cfg.growth * up)) - coming
        start = max(below_minimum, min(wanted - have, cap))
        if start <= 0:
            return Decision(0, (), (), wanted, f"wait for the {coming} coming: {state}")
        return Decision(start, (), (), wanted, f"start {start}: {state}")
    excess = have - wanted
    if excess <= 0:
        return Decision(0, (), (), wanted, f"steady: {state}")
    pendings = sorted((w for w in snap.workers if w.state == PENDING),
                      key=lambda w: -w.id)
    cancel = tuple(w.id for w in pendings[:excess])
    excess -= len(cancel)
    over_maximum = have - len(cancel) > cfg.maximum
    idles = sorted((w for w in snap.workers if w.state == IDLE),
                   key=lambda w: (w.idle_since if w.idle_since is not None else snap.now,
                                  w.id))
    retire = []
    for w in idles:
        if excess <= 0:
            break
        since = w.idle_since if w.idle_since is not None else snap.now
        if not over_maximum and snap.now - since < cfg.idle_timeout:
            break  # the longest idle has not timed out: none of the others has
        retire.append(w.id)
        excess -= 1
        over_maximum = have - len(cancel) - len(retire) > cfg.maximum
    parts = []
    if cancel:
        parts.append(f"cancel {len(cancel)} pending")
    if retire:
        parts.append(f"give back {len(retire)} idle")
    if not parts:
        return Decision(0, (), (), wanted, f"hold until idle {cfg.idle_timeout:g} s: {state}")
    return Decision(0, tuple(retire), cancel, wanted, f"{', '.join(parts)}: {state}")
