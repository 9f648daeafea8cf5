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

**Placements** (``Settings.placements``: the maxima of the contexts the workers may come
from, in order of preference; empty: one, the pool's own, of ``maximum``): a worker is
started in the first placement with room that is not skipped (``Snapshot.retry_at``:
a placement whose start failed is skipped until then, :func:`backoff` after each
failure in a row), so the first fills before the next; given back or cancelled, the
last placement's go first (then as above), and a placement above its own maximum gives
back its idle workers at once. A worker of no placement (``placement`` past the last:
started before ``adapt`` named placements) is given back first, at once when idle.

A worker the pool starts without a decision (the replacement of one that reached
``maxtasksperchild``) goes where :func:`replacement` says: where a decision would start
one, the first placement with room that is not skipped (so the same placement as the
worker it replaces, unless an earlier one has room).

``task_seconds`` is in the snapshot (and the stats) but no rule uses it yet: a rule
that skips starting a worker for a queue that drains before the worker would be up
needs the backend's start time, which the pool does not measure yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["BACKOFF_FIRST", "BACKOFF_LONGEST", "BUSY", "IDLE", "PENDING", "STARTING", "STARTING_FLOOR", "Decision", "Settings",
           "Snapshot", "WorkerView", "backoff", "decide", "replacement"]

PENDING, STARTING, BUSY, IDLE = "pending", "starting", "busy", "idle"
#: workers that may be coming at once however few are up (growth multiplies the rest)
STARTING_FLOOR = 4
#: seconds a placement is skipped after its first failure in a row; doubled after each
#: further one, up to BACKOFF_LONGEST
BACKOFF_FIRST = 2.0
BACKOFF_LONGEST = 60.0


def backoff(failures: int) -> float:
    """Seconds a placement is skipped after ``failures`` (>= 1) failures in a row."""
    return min(BACKOFF_LONGEST, BACKOFF_FIRST * 2.0 ** min(failures - 1, 30))


@dataclass(frozen=True)
class Settings:
    """The knobs of :meth:`fiber.Pool.adapt` (checked there)."""

    minimum: int = 0
    maximum: int = 1
    idle_timeout: float = 30.0  # seconds a worker may stay idle before it is given back
    growth: float = 2.0  # workers coming at once, as a multiple of the workers up
    # each placement's maximum, in order of preference (empty: one placement, maximum)
    placements: tuple[int, ...] = ()

    def caps(self) -> tuple[int, ...]:
        """Each placement's maximum (one placement of ``maximum`` when none is named)."""
        return self.placements or (self.maximum,)


@dataclass(frozen=True)
class WorkerView:
    """One worker the pool still counts (not one being let go)."""

    id: int
    state: str  # PENDING (queued by the cluster), STARTING, BUSY or IDLE
    idle_since: float | None = None  # when it last became idle (IDLE only), on the clock
    placement: int = 0  # the index of its placement in Settings.caps()


@dataclass(frozen=True)
class Snapshot:
    """What the policy sees of a pool at ``now`` (seconds of any monotonic clock)."""

    now: float
    queued: int  # tasks waiting for a worker
    running: int  # tasks workers are running
    workers: tuple[WorkerView, ...]
    settings: Settings
    task_seconds: float | None = None  # a task's recent duration (None: not measured)
    # per placement: skipped until then (absent or past: usable)
    retry_at: tuple[float, ...] = ()

    def count(self, state: str) -> int:
        return sum(1 for w in self.workers if w.state == state)

    def skipped(self, placement: int) -> bool:
        """Whether ``placement`` is skipped now (its start failed, not retried yet)."""
        return placement < len(self.retry_at) and self.now < self.retry_at[placement]


@dataclass(frozen=True)
class Decision:
    """What to do: ``start`` new workers, ``placed[i]`` of them in placement ``i``,
    give back the idle workers ``retire``, cancel the pending jobs of ``cancel``;
    ``wanted`` is the size aimed for and ``reason`` says why in one line."""

    start: int
    retire: tuple[int, ...]
    cancel: tuple[int, ...]
    wanted: int
    reason: str
    placed: tuple[int, ...] = ()

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
    caps = cfg.caps()
    held = [0] * (len(caps) + 1)  # workers per placement (the last: of none)
    for w in snap.workers:
        held[min(w.placement, len(caps))] += 1
    if have < wanted:
        below_minimum = max(0, cfg.minimum - have)
        cap = max(STARTING_FLOOR, math.ceil(cfg.growth * up)) - coming
        start = max(below_minimum, min(wanted - have, cap))
        if start <= 0:
            return Decision(0, (), (), wanted, f"wait for the {coming} coming: {state}")
        placed, skipped = _place(snap, caps, held, start)
        start = sum(placed)
        note = f" (skipped: placement {', '.join(map(str, skipped))})" if skipped else ""
        if start <= 0:
            return Decision(0, (), (), wanted, f"no placement has room{note}: {state}",
                            placed)
        where = "" if len(caps) == 1 else " (" + ", ".join(
            f"{n} in placement {i}" for i, n in enumerate(placed) if n) + ")"
        return Decision(start, (), (), wanted, f"start {start}{where}{note}: {state}",
                        placed)
    excess = have - wanted
    over_cap = [max(0, n - c) for n, c in zip(held, caps + (0,), strict=True)]
    if excess <= 0 and not any(over_cap):
        return Decision(0, (), (), wanted, f"steady: {state}")
    last = len(caps)

    def place(w: WorkerView) -> int:
        return min(w.placement, last)

    # the last placement's first (a worker of none before any), then the newest
    pendings = sorted((w for w in snap.workers if w.state == PENDING),
                      key=lambda w: (-place(w), -w.id))
    cancel = tuple(w.id for w in pendings[:max(0, excess)])
    excess -= len(cancel)
    for w in pendings[:len(cancel)]:
        over_cap[place(w)] = max(0, over_cap[place(w)] - 1)
    over_maximum = have - len(cancel) > cfg.maximum
    idles = sorted((w for w in snap.workers if w.state == IDLE),
                   key=lambda w: (-place(w),
                                  w.idle_since if w.idle_since is not None else snap.now,
                                  w.id))
    retire: list[int] = []
    for w in idles:
        at_once = over_maximum or over_cap[place(w)] > 0
        if excess <= 0 and not at_once:
            continue
        since = w.idle_since if w.idle_since is not None else snap.now
        if not at_once and snap.now - since < cfg.idle_timeout:
            continue  # not idle long enough (a later placement's may be)
        if have - len(cancel) - len(retire) <= cfg.minimum:
            break
        retire.append(w.id)
        excess -= 1
        over_cap[place(w)] = max(0, over_cap[place(w)] - 1)
        over_maximum = have - len(cancel) - len(retire) > cfg.maximum
    parts = []
    if cancel:
        parts.append(f"cancel {len(cancel)} pending")
    if retire:
        parts.append(f"give back {len(retire)} idle")
    if not parts:
        return Decision(0, (), (), wanted, f"hold until idle {cfg.idle_timeout:g} s: {state}")
    return Decision(0, tuple(retire), cancel, wanted, f"{', '.join(parts)}: {state}")


def replacement(settings: Settings, held: list[int], retry_at: tuple[float, ...],
                now: float) -> int:
    """The placement of a worker started without a decision, given ``held``, the
    workers each placement holds (not counting it): the first with room that is not
    skipped; with none, the first with room; with none, the first placement."""
    caps = settings.caps()
    snap = Snapshot(now, 0, 0, (), settings, None, retry_at)
    placed, _ = _place(snap, caps, held, 1)
    for i, n in enumerate(placed):
        if n:
            return i
    return next((i for i, cap in enumerate(caps) if held[i] < cap), 0)


def _place(snap: Snapshot, caps: tuple[int, ...], held: list[int],
           start: int) -> tuple[tuple[int, ...], list[int]]:
    """``start`` new workers spread over the placements in order (the first with room
    first), skipping the skipped; and the skipped placements that had room."""
    placed = [0] * len(caps)
    skipped = []
    left = start
    for i, cap in enumerate(caps):
        room = cap - held[i]
        if room <= 0:
            continue
        if snap.skipped(i):
            skipped.append(i)
            continue
        placed[i] = min(room, left)
        left -= placed[i]
        if left <= 0:
            break
    return tuple(placed), skipped
