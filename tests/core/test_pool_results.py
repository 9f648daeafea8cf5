"""The result objects of fiber.Pool, on their own (no pool: the outcome is delivered by
calling ``_set`` as the pool's channel does)."""

from __future__ import annotations

import threading
import time

import pytest

from fiber.errors import TimeoutError
from fiber.runtime.pool.results import ApplyResult, MapResult


def test_every_waiting_thread_wakes():
    result = ApplyResult()
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(result.get(10)))
               for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    assert not result.ready() and not seen
    # the sink's _set (multiprocessing's ApplyResult._set), called as channel.deliver does
    result._set(0, 1, True, 42)
    for t in threads:
        t.join(10)
    assert seen == [42] * 4
    assert result.get(0) == 42 and result.successful()


@pytest.mark.parametrize("timeout", [0, -1, 0.05])
def test_wait_returns_after_its_timeout(timeout):
    result = ApplyResult()
    start = time.monotonic()
    result.wait(timeout)
    assert time.monotonic() - start < 5
    with pytest.raises(TimeoutError):
        result.get(timeout)
    with pytest.raises(ValueError):
        result.successful()


def test_first_outcome_stands_and_callbacks_run_before_ready():
    order = []
    result = ApplyResult(callback=lambda v: order.append(("cb", v, result.ready())))
    result._set(0, 1, True, "first")  # the sink, as channel.deliver calls it
    result._set(0, 1, False, ValueError("late"))
    assert order == [("cb", "first", False)]
    assert result.get() == "first"


def test_a_failing_callback_does_not_leave_waiters_hanging():
    def bad(_):
        raise RuntimeError("callback bug")

    result = ApplyResult(callback=bad)
    with pytest.raises(RuntimeError):
        result._set(0, 1, True, 1)  # the sink, as channel.deliver calls it
    assert result.get(1) == 1


def test_map_result_assembles_chunks_and_fails_on_first_error():
    result = MapResult(4)
    result._set(2, 2, True, ["c", "d"])  # the sink, as channel.deliver calls it
    assert not result.ready()
    result._set(0, 2, True, ["a", "b"])
    assert result.get(1) == ["a", "b", "c", "d"]
    failed = MapResult(4)
    failed._set(0, 2, False, KeyError("x"))  # the sink, as channel.deliver calls it
    failed._set(2, 2, True, ["c", "d"])
    with pytest.raises(KeyError):
        failed.get(1)
    assert MapResult(0).get(0) == []


def _boom(_):
    raise RuntimeError("callback bug")


def test_pool_survives_a_raising_callback(caplog):
    import fiber

    with fiber.Pool(2) as pool:
        results = [pool.apply_async(abs, (-i,), callback=_boom) for i in range(6)]
        assert [r.get(30) for r in results] == list(range(6))
        assert pool.map(abs, range(-20, 0), chunksize=1) == list(range(20, 0, -1))
    assert "a callback of pool task" in caplog.text and "callback bug" in caplog.text

