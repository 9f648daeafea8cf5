"""The adaptive pool's placements (issue #28, one pool over several backends) in its
policy, a pure function: snapshots made by hand, a fake clock (plain numbers), no
process, no backend: the order in which placements fill, the order in which they give
back, and a placement skipped after a failure and tried again after its backoff."""

from __future__ import annotations

from fiber.runtime.pool.adapt_policy import (
    BACKOFF_FIRST,
    BACKOFF_LONGEST,
    BUSY,
    IDLE,
    PENDING,
    STARTING,
    Settings,
    Snapshot,
    WorkerView,
    backoff,
    decide,
)


def snap(workers=(), *, now=100.0, queued=0, caps=(2, 4), minimum=0, idle_timeout=5.0,
         growth=2.0, retry_at=()):
    """``workers``: (state, idle_since, placement) triples, ids from 1."""
    views = tuple(WorkerView(i + 1, state, since, place)
                  for i, (state, since, place) in enumerate(workers))
    return Snapshot(now, queued, sum(1 for w in views if w.state == BUSY), views,
                    Settings(minimum, sum(caps), idle_timeout, growth, tuple(caps)),
                    retry_at=tuple(retry_at))


def test_the_first_placement_fills_before_the_next():
    d = decide(snap(queued=1))
    assert d.placed == (1, 0) and d.start == 1
    d = decide(snap(queued=3))
    assert d.placed == (2, 1) and d.start == 3
    assert "2 in placement 0, 1 in placement 1" in d.reason
    # the first is full (its workers busy or coming): the rest go to the second
    d = decide(snap([(BUSY, None, 0), (STARTING, None, 0)], queued=10))
    assert d.placed == (0, 3) and d.wanted == 6  # 3: 4 coming at once, 1 is


def test_the_queue_past_every_maximum_is_bounded_by_their_sum():
    d = decide(snap([(BUSY, None, 0)] * 2 + [(BUSY, None, 1)] * 4, queued=100))
    assert d.start == 0 and d.wanted == 6


def test_the_last_placement_gives_back_first():
    workers = [(IDLE, 50.0, 0), (IDLE, 60.0, 0), (IDLE, 90.0, 1), (IDLE, 80.0, 1)]
    # all timed out; one worker is still wanted (minimum 1)
    d = decide(snap(workers, minimum=1))
    assert d.retire == (4, 3, 1)  # placement 1's (longest idle first), then placement 0's
    # the first placement's longer idle does not make it go before the second's
    d = decide(snap(workers, queued=0, minimum=3))
    assert d.retire == (4,)
    # pending jobs: the last placement's are cancelled first
    workers = [(PENDING, None, 0), (PENDING, None, 1), (PENDING, None, 0), (BUSY, None, 0)]
    d = decide(snap(workers, queued=2))  # wanted 3 of 4
    assert d.cancel == (2,)


def test_a_later_placement_gives_back_once_timed_out_even_if_the_first_has_not():
    workers = [(IDLE, 99.0, 0), (IDLE, 90.0, 1)]
    d = decide(snap(workers))
    assert d.retire == (2,)


def test_a_placement_above_its_maximum_gives_back_its_idle_at_once():
    workers = [(IDLE, 99.0, 0)] * 3 + [(BUSY, None, 1)]
    d = decide(snap(workers, queued=3))  # wanted 4: no excess, but placement 0 holds 3 of 2
    assert d.retire == (1,)


def test_a_worker_of_no_placement_goes_first_and_is_never_started():
    workers = [(IDLE, 99.0, 0), (IDLE, 99.0, 2)]  # 2: past the last placement
    d = decide(snap(workers, minimum=1))
    assert d.retire == (2,)
    d = decide(snap([(BUSY, None, 0)] * 2 + [(BUSY, None, 1)] * 4 + [(BUSY, None, 2)],
                    queued=5))
    assert d.start == 0


def test_a_skipped_placement_is_passed_over_until_its_retry_time():
    failed_at = 100.0
    retry_at = (0.0, failed_at + backoff(1))
    d = decide(snap([(BUSY, None, 0)] * 2, now=failed_at + 0.5, queued=3,
                    retry_at=retry_at))
    assert d.start == 0 and d.placed == (0, 0)
    assert "no placement has room" in d.reason and "skipped: placement 1" in d.reason
    # the first placement still takes what it has room for
    d = decide(snap([(BUSY, None, 0)], now=failed_at + 0.5, queued=3, retry_at=retry_at))
    assert d.placed == (1, 0) and "skipped: placement 1" in d.reason
    # once the backoff is over, placement 1 is tried again
    d = decide(snap([(BUSY, None, 0)] * 2, now=failed_at + backoff(1), queued=3,
                    retry_at=retry_at))
    assert d.placed == (0, 3)
    # the first placement skipped: the second is used meanwhile
    d = decide(snap(now=100.0, queued=3, retry_at=(101.0, 0.0)))
    assert d.placed == (0, 3)


def test_the_backoff_doubles_up_to_its_longest():
    assert backoff(1) == BACKOFF_FIRST
    assert backoff(2) == 2 * BACKOFF_FIRST
    assert backoff(3) == 4 * BACKOFF_FIRST
    assert backoff(100) == BACKOFF_LONGEST
    assert backoff(10**6) == BACKOFF_LONGEST
