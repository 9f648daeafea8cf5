"""Pool.adapt(placements=...) on the local backend: one pool whose workers come from
two local contexts (two backend instances: the second context has a setting of its
own), real workers started and given back by the driver. The failing placement is a
real one: a context whose jobs run a Python executable that does not exist, so its
workers never connect. Timings are bounds: the machine may be loaded."""

from __future__ import annotations

import functools
import logging
import os
import time

import adapt_burst
import pytest

import fiber

pytestmark = pytest.mark.timeout(120)


def pid_after(seconds):
    time.sleep(seconds)
    return os.getpid()


def pid_when(path):
    """A task that runs until ``path`` exists (at most 100 s), then returns its pid."""
    deadline = time.monotonic() + 100
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    return os.getpid()


wait_for = functools.partial(adapt_burst.wait_for, every=0.05)
by_placement = adapt_burst.held


def test_a_burst_fills_the_first_placement_then_the_next_and_both_go_back_to_zero(tmp_path):
    """local up to 2, then a second local context up to 3: a long map uses both (the
    stats show each placement's workers), the pool never holds more than 2 + 3, and
    after the idle timeout both are at zero; the next map runs correctly."""
    first = fiber.get_context("local")
    second = fiber.get_context("local", heartbeat_interval=4.0)
    # The map's tasks run until three workers are busy: a map of a fixed length (60
    # tasks of 0.1 s) could end before a loaded machine started the third (issue #44).
    release = tmp_path / "release"
    with fiber.Pool(1) as pool:
        pool.adapt(0, placements=[(first, 2), (second, 3)], idle_timeout=1.0)
        assert pool.stats().adapt.maximum == 5
        seen = []
        result = pool.map_async(pid_when, [str(release)] * 60, chunksize=1)
        while not result.ready():
            counts = by_placement(pool)
            seen.append(counts)
            assert counts[0] <= 2 and counts[1] <= 3, counts
            if sum(p.busy for p in pool.stats().adapt.placements) >= 3:
                release.touch()
            time.sleep(0.05)
        assert len(set(result.get())) >= 3  # more workers than the first placement's
        assert any(c[0] == 2 and c[1] >= 1 for c in seen), seen
        places = pool.stats().adapt.placements
        assert [p.name for p in places] == ["local", "local(heartbeat_interval=4.0)"]
        assert [p.maximum for p in places] == [2, 3]
        wait_for(lambda: by_placement(pool) == [0, 0], 15, "both placements at zero")
        assert pool.stats().processes == 0
        reasons = [r for _, r in pool.stats().adapt.decisions]
        assert any("in placement 1" in r for r in reasons), reasons
        assert pool.map(abs, range(-5, 5)) == [abs(x) for x in range(-5, 5)]


def test_top_shows_each_placement():
    """In-process: the snapshot ``fiber top`` gets (runtime/status.py) and its view
    carry each placement's workers: wanted, pending, starting, busy, idle."""
    from rich.console import Console

    from fiber import top
    from fiber.runtime import status

    first = fiber.get_context("local")
    second = fiber.get_context("local", heartbeat_interval=4.0)
    with fiber.Pool(1) as pool:
        pool.adapt(0, placements=[(first, 1), (second, 2)], idle_timeout=60.0)
        result = pool.map_async(pid_after, [0.3] * 30, chunksize=1)
        wait_for(lambda: [p.busy for p in pool.stats().adapt.placements] == [1, 2], 20,
                 "both placements busy")
        view = status.pool_status(1, pool.stats())
        places = view["adapt"]["placements"]
        assert [(p["maximum"], p["wanted"], p["busy"]) for p in places] == [(1, 1, 1),
                                                                             (2, 3 - 1, 2)]
        snap = {"program": {"pid": 1, "run": "r", "backend": "local", "since": 0,
                            "argv": ["x"]}, "time": 1.0, "pools": [view]}
        console = Console(width=200, record=True)
        console.print(top.render(snap, []))
        text = console.export_text()
        assert "placement 0 local (max 1): wanted 1, pending 0, starting 0, busy 1, idle 0" \
            in text, text
        assert "placement 1 local(heartbeat_interval=4.0) (max 2): wanted 2" in text, text
        result.get(60)


def test_a_placement_whose_jobs_fail_is_skipped_with_one_log_line(caplog):
    """The first placement's jobs fail (their Python does not exist): the pool does not
    break, the second placement runs every task, and one warning says the first is
    skipped."""
    broken = fiber.get_context("local", python="/nonexistent/python3")
    good = fiber.get_context("local", heartbeat_interval=4.0)
    caplog.set_level(logging.WARNING, logger="fiber")
    with fiber.Pool(1) as pool:
        pool.adapt(0, placements=[(broken, 2), (good, 2)], idle_timeout=5.0)
        started = time.monotonic()
        assert pool.map(pid_after, [0.05] * 40, chunksize=1)
        took = time.monotonic() - started
        skipped = [r for r in caplog.records
                   if r.name == "fiber" and "placement 0" in r.getMessage()
                   and "skipped" in r.getMessage()]
        assert len(skipped) == 1, [r.getMessage() for r in caplog.records]
        assert pool.stats().adapt.placements[0].skipped > 0 or took > 1
    assert took < 30, took


def test_every_placement_failing_breaks_the_pool_with_a_clear_error():
    """Both placements' jobs fail (their Python does not exist) and the pool has no
    worker: after a few failures in a row of each, the map fails with a
    ProcessStartError naming both placements, within seconds, rather than wait."""
    one = fiber.get_context("local", python="/nonexistent/python3")
    two = fiber.get_context("local", python="/nonexistent/python3",
                            heartbeat_interval=4.0)
    pool = fiber.Pool(1)
    try:
        pool.adapt(0, placements=[(one, 2), (two, 2)], idle_timeout=0.0)
        # the pool's own worker is of no placement: given back once idle
        wait_for(lambda: not pool.stats().workers, 20, "the pool's own worker given back")
        fiber_wait = time.monotonic()
        with pytest.raises(fiber.ProcessStartError) as caught:
            pool.map(abs, range(10), chunksize=1)
        took = time.monotonic() - fiber_wait
        message = str(caught.value)
        assert "every placement of the adaptive pool failed 3 times" in message, message
        assert "placement 0 (local(python=" in message and "placement 1 (local(" in message
        assert took < 60, took
    finally:
        pool.terminate()
        pool.join()


def test_a_transient_error_of_a_placement_is_logged_once(run_script):
    """The faulty backend (tests/fault_plugin: the local backend with faults injected in
    front of it) answers the first job creation with a TransientBackendError (an API
    server's 503). The placement does not wait out the error (the other carries on), so
    the retry's own warning ("retrying for up to 180 s") would be false and a second
    line for one event: exactly one WARNING line, the placement's, which names the
    error; every task runs. In a child process: the plugin is found on its PYTHONPATH."""
    from test_faults import faulty_env

    result = run_script(
        """
        import fiber

        if __name__ == "__main__":
            fiber.log_to_stderr()
            faulty, local = fiber.get_context("faulty"), fiber.get_context("local")
            pool = fiber.Pool(1, context=local)
            try:
                pool.adapt(0, placements=[(faulty, 2), (local, 2)], idle_timeout=5.0)
                print("result", pool.map(abs, range(-20, 20), chunksize=1)
                      == [abs(x) for x in range(-20, 20)])
            finally:
                pool.terminate()
                pool.join()
        """, env=faulty_env(FAULTY_CREATE_TRANSIENT="1"))
    assert result.returncode == 0, result.stderr
    assert "result True" in result.stdout, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, result.stderr
    assert "placement 0 (faulty) skipped" in warnings[0] and "503" in warnings[0], warnings


def test_a_worker_replaced_after_maxtasksperchild_goes_where_the_policy_wants():
    """maxtasksperchild=3 with placements local up to 1, then a second local context up
    to 2: the workers of both reach their maximum of tasks and are replaced during a
    long map. A replacement goes where the policy would start a worker (the first
    placement with room), so the first placement never holds more than its 1 (each
    second-placement worker was replaced in the first before: 2, 3 ... there)."""
    first = fiber.get_context("local")
    second = fiber.get_context("local", heartbeat_interval=4.0)
    with fiber.Pool(1, maxtasksperchild=3) as pool:
        pool.adapt(0, placements=[(first, 1), (second, 2)], idle_timeout=5.0)
        result = pool.map_async(pid_after, [0.05] * 90, chunksize=1)
        seen = []
        while not result.ready():
            seen.append(by_placement(pool))
            time.sleep(0.02)
        pids = result.get()
        assert len(set(pids)) >= 90 // 3, len(set(pids))  # replaced all along
        assert max(c[0] for c in seen) <= 1, [c for c in seen if c[0] > 1][:5]
        assert max(c[1] for c in seen) <= 2, [c for c in seen if c[1] > 2][:5]
        assert any(c[1] >= 1 for c in seen), seen
