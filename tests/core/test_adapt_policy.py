"""The adaptive pool's policy (fiber.runtime.pool.adapt_policy) as the pure function
it is: snapshots made by hand, a fake clock (plain numbers), no process, no pool."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fiber.runtime.pool.adapt_policy import (
    BUSY,
    IDLE,
    PENDING,
    STARTING,
    STARTING_FLOOR,
    Settings,
    Snapshot,
    WorkerView,
    decide,
    replacement,
)


def snap(now=100.0, queued=0, workers=(), minimum=0, maximum=4, idle_timeout=5.0,
         growth=2.0):
    views = tuple(w if isinstance(w, WorkerView) else WorkerView(i + 1, w[0], w[1])
                  for i, w in enumerate(workers))
    return Snapshot(now, queued, sum(1 for w in views if w.state == BUSY), views,
                    Settings(minimum, maximum, idle_timeout, growth))


def test_grows_with_the_queue_up_to_the_maximum():
    d = decide(snap(queued=10, maximum=4))
    assert (d.start, d.retire, d.cancel, d.wanted) == (4, (), (), 4)
    assert d.reason.startswith("start 4:") and "10 queued" in d.reason


def test_workers_coming_count_no_over_submission():
    d = decide(snap(queued=10, workers=[(PENDING, None), (STARTING, None)], maximum=4))
    assert d.start == 2
    d = decide(snap(queued=10, workers=[(PENDING, None)] * 4, maximum=4))
    assert d.start == 0 and d.wanted == 4


def test_growth_caps_the_workers_coming_at_once():
    d = decide(snap(queued=100, maximum=100, growth=2.0))
    assert d.start == STARTING_FLOOR
    workers = [(BUSY, None)] * 10 + [(STARTING, None)] * 5
    d = decide(snap(queued=100, workers=workers, maximum=100, growth=2.0))
    assert d.start == 20 - 5  # at most 2 x 10 up coming at once
    d = decide(snap(queued=100, workers=[(STARTING, None)] * 4, maximum=100))
    assert d.start == 0 and d.reason.startswith("wait for the 4 coming")


def test_minimum_is_started_regardless_of_growth():
    d = decide(snap(minimum=6, maximum=8, growth=0.1))
    assert d.start == 6


def test_idle_workers_are_given_back_only_after_the_timeout():
    workers = [(IDLE, 97.0), (IDLE, 90.0), (BUSY, None)]
    d = decide(snap(now=100.0, workers=workers, idle_timeout=5.0))
    assert d.retire == (2,) and d.start == 0  # idle 10 s; the other only 3 s
    assert "give back 1 idle" in d.reason
    d = decide(snap(now=102.5, workers=workers, idle_timeout=5.0))
    assert sorted(d.retire) == [1, 2]


def test_never_below_the_minimum():
    workers = [(IDLE, 0.0)] * 3
    d = decide(snap(now=100.0, workers=workers, minimum=2))
    assert len(d.retire) == 1 and d.wanted == 2


def test_pending_jobs_are_cancelled_when_no_longer_needed_before_any_idle():
    workers = [(IDLE, 0.0), (PENDING, None), (PENDING, None), (BUSY, None)]
    d = decide(snap(now=100.0, queued=0, workers=workers, minimum=0))
    assert d.cancel == (3, 2)  # newest first
    assert d.retire == (1,)  # and the idle one, timed out
    # still needed: a queued task keeps one of them
    d = decide(snap(now=100.0, queued=2, workers=[(BUSY, None), (PENDING, None),
                                                  (PENDING, None), (PENDING, None)]))
    assert d.cancel == (4,) and d.start == 0


def test_above_the_maximum_idle_workers_go_at_once_busy_ones_stay():
    workers = [(IDLE, 99.9)] * 2 + [(BUSY, None)] * 4
    d = decide(snap(now=100.0, queued=5, workers=workers, maximum=3))
    assert sorted(d.retire) == [1, 2] and d.start == 0


def test_steady_when_the_pool_has_what_it_wants():
    d = decide(snap(queued=1, workers=[(BUSY, None), (STARTING, None)]))
    assert not d.changes and d.wanted == 2 and d.reason.startswith("steady")
    d = decide(snap(queued=0, workers=[(BUSY, None)] * 2))
    assert not d.changes and d.reason.startswith("steady")


# -- properties ------------------------------------------------------------------

_states = st.sampled_from([PENDING, STARTING, BUSY, IDLE])


@st.composite
def snapshots(draw):
    now = draw(st.floats(min_value=0, max_value=1e6))
    minimum = draw(st.integers(0, 8))
    maximum = draw(st.integers(max(1, minimum), 16))
    n = draw(st.integers(0, 24))
    workers = []
    for i in range(n):
        state = draw(_states)
        since = draw(st.floats(min_value=0, max_value=now)) if state == IDLE else None
        workers.append(WorkerView(i + 1, state, since))
    return Snapshot(now, draw(st.integers(0, 200)), 0, tuple(workers),
                    Settings(minimum, maximum, draw(st.floats(0, 100)),
                             draw(st.floats(0.1, 10))))


def _after(s, d):
    return len(s.workers) + d.start - len(d.retire) - len(d.cancel)


@settings(max_examples=400, deadline=None)
@given(snapshots())
def test_never_over_the_maximum_never_below_the_minimum(s):
    d = decide(s)
    have = len(s.workers)
    after = _after(s, d)
    if have <= s.settings.maximum:
        assert after <= s.settings.maximum, d
    else:  # (started above it by hand): it only shrinks, as far as idle workers allow
        assert d.start == 0, d
        gone = sum(1 for w in s.workers if w.state in (IDLE, PENDING))
        assert after <= s.settings.maximum or after == have - gone, d
    assert after >= s.settings.minimum, d  # below it: started up to it at once


@settings(max_examples=400, deadline=None)
@given(snapshots())
def test_never_gives_back_a_busy_or_starting_worker(s):
    d = decide(s)
    states = {w.id: w.state for w in s.workers}
    assert all(states[i] == IDLE for i in d.retire), d
    assert all(states[i] == PENDING for i in d.cancel), d
    assert len(set(d.retire)) == len(d.retire) and len(set(d.cancel)) == len(d.cancel)
    assert not (d.start and (d.retire or d.cancel)), d
    assert d.reason and "\n" not in d.reason


@settings(max_examples=200, deadline=None)
@given(snapshots(), st.floats(0.05, 5.0))
def test_converges_to_the_minimum_when_idle_long_enough(s, tick):
    """Nothing queued and the busy workers finish: ticks of a fake clock bring the
    pool to exactly ``minimum`` workers, after about ``idle_timeout``."""
    now = s.now
    workers = [WorkerView(w.id, IDLE, now) if w.state == BUSY else w for w in s.workers]
    ids = len(workers) + 1
    for _ in range(int(s.settings.idle_timeout / tick) + 20):
        cur = Snapshot(now, 0, 0, tuple(workers), s.settings)
        d = decide(cur)
        gone = set(d.retire) | set(d.cancel)
        workers = [w for w in workers if w.id not in gone]
        for _ in range(d.start):
            workers.append(WorkerView(ids, STARTING))
            ids += 1
        # the workers coming connect, idle from now on
        workers = [WorkerView(w.id, IDLE, now) if w.state in (STARTING, PENDING) else w
                   for w in workers]
        now += tick
    assert len(workers) == s.settings.minimum


def test_a_replacement_goes_to_the_first_placement_with_room_not_skipped():
    """(maxtasksperchild's replacement, started without a decision.)"""
    cfg = Settings(0, 6, 5.0, 2.0, placements=(1, 2, 3))
    assert replacement(cfg, [0, 2, 3, 0], (), 10.0) == 0  # the first has room again
    assert replacement(cfg, [1, 1, 3, 0], (), 10.0) == 1  # the one it replaces
    assert replacement(cfg, [1, 2, 2, 0], (), 10.0) == 2
    assert replacement(cfg, [0, 1, 3, 0], (20.0,), 10.0) == 1  # the first is skipped
    assert replacement(cfg, [0, 2, 3, 0], (20.0, 0.0), 10.0) == 0  # only it has room
    assert replacement(cfg, [1, 2, 3, 0], (), 10.0) == 0  # none has room
