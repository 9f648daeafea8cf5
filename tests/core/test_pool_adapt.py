"""Pool.adapt on the local backend: real workers, started and given back by the
adaptive pool's driver (fiber.runtime.pool.adapt). Nothing is faked; the faults are
real (a worker killed with SIGKILL). Timings are bounds, not exact values: the
machine may be loaded."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time

import adapt_burst
import pytest

import fiber


def square(x):
    return x * x


def nap_square(x):
    time.sleep(0.05)
    return x * x


def logged(args):
    """Runs item ``i``, sleeping ``seconds``; appends ``i`` to ``path`` (one line per
    execution, O_APPEND: the lines of concurrent workers do not mix)."""
    path, i, seconds = args
    time.sleep(seconds)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * 3


def adapt_thread(before):
    """The adapt driver's thread started since ``before`` was taken (the driver runs on
    a thread named ``fiber-pool-adapt``: fiber.runtime.pool.adapt)."""
    new = [t for t in threading.enumerate()
           if t.name == "fiber-pool-adapt" and t not in before]
    assert len(new) == 1, new
    return new[0]


def sleep_long(_):
    time.sleep(30)


wait_for = functools.partial(adapt_burst.wait_for, every=0.02)


def alive_workers():
    return [c for c in fiber.active_children() if c.is_alive()]


def counted(stats):
    return stats.starting + stats.idle + stats.busy


def test_scales_to_zero_after_idle_and_back_up():
    with fiber.Pool(2) as pool:
        pool.adapt(minimum=0, maximum=4, idle_timeout=0.5)
        assert pool.map(square, range(40)) == [x * x for x in range(40)]
        seen = [w.process for w in pool.stats().workers if w.process is not None]
        wait_for(lambda: counted(pool.stats()) == 0 and pool.stats().stopping == 0, 10,
                 "the pool gave back every worker")
        stats = pool.stats()
        assert stats.processes == 0 and stats.workers == ()
        assert stats.adapt is not None and stats.adapt.wanted == 0
        assert any("give back" in reason for _, reason in stats.adapt.decisions)
        wait_for(lambda: not alive_workers(), 5, "every worker process exited")
        assert all(p.exitcode is not None for p in seen)
        # the next map starts workers again and runs correctly
        assert pool.map(square, range(100)) == [x * x for x in range(100)]
        assert pool.stats().started > len(seen)
        assert pool.stats().lost == 0


def test_the_queue_grows_past_the_maximum_never_more_workers():
    maximum = 3
    with fiber.Pool(1) as pool:
        pool.adapt(minimum=0, maximum=maximum, idle_timeout=5.0)
        result = pool.map_async(nap_square, range(60), chunksize=1)
        most_counted = most_alive = 0
        while not result.ready():
            stats = pool.stats()
            most_counted = max(most_counted, counted(stats) + stats.stopping)
            most_alive = max(most_alive, len(alive_workers()))
            time.sleep(0.01)
        assert result.get(10) == [x * x for x in range(60)]
        assert most_counted <= maximum, most_counted
        assert most_alive <= maximum, most_alive
        assert most_counted >= 2  # it did grow from 1 (4 s of work queued)
        assert pool.stats().started <= maximum


def test_no_worker_is_given_back_with_a_task_on_it_nor_a_task_run_twice(tmp_path):
    """idle_timeout=0: a worker is given back the moment it is idle, between bursts
    of tasks of mixed lengths; every result is right and every task ran once."""
    log = tmp_path / "runs.log"
    expected = {}
    with fiber.Pool(2) as pool:
        pool.adapt(minimum=0, maximum=4, idle_timeout=0.0)
        n = 0
        for _ in range(4):
            items = [(str(log), n + k, (k % 5) * 0.01) for k in range(30)]
            n += len(items)
            results = sorted(pool.imap_unordered(logged, items))
            assert results == sorted(i * 3 for _, i, _ in items)
            expected.update({i: 1 for _, i, _ in items})
            time.sleep(0.3)  # idle: the workers are given back
        stats = pool.stats()
        assert stats.lost == 0 and stats.failed == 0
        assert sum(1 for _, r in stats.adapt.decisions if "give back" in r) >= 1
    runs: dict[int, int] = {}
    for line in log.read_text().split():
        runs[int(line)] = runs.get(int(line), 0) + 1
    assert runs == expected


def test_terminate_while_adapting_ends_everything():
    pool = fiber.Pool(1)
    before = threading.enumerate()
    pool.adapt(minimum=0, maximum=4, idle_timeout=5.0)
    driver = adapt_thread(before)
    result = pool.map_async(sleep_long, range(8), chunksize=1)
    wait_for(lambda: pool.stats().busy >= 2, 10, "the pool grew to 2 busy workers")
    started = time.monotonic()
    pool.terminate()
    assert time.monotonic() - started < 10
    pool.join()
    assert not driver.is_alive()
    assert not alive_workers()
    with pytest.raises(ValueError, match="terminated"):
        result.get(1)
    assert counted(pool.stats()) == 0


def test_close_while_adapted_to_zero_starts_workers_for_the_rest():
    pool = fiber.Pool(1)
    pool.adapt(minimum=0, maximum=2, idle_timeout=0.2)
    wait_for(lambda: counted(pool.stats()) == 0, 10, "the pool gave back its worker")
    result = pool.map_async(square, range(20))
    pool.close()
    pool.join()  # the driver starts workers for the queued tasks, then they exit
    assert result.get(0) == [x * x for x in range(20)]
    assert not alive_workers()


def test_a_lost_worker_is_replaced_only_if_still_wanted():
    with fiber.Pool(2) as pool:
        pool.adapt(minimum=2, maximum=3, idle_timeout=60.0)
        wait_for(lambda: pool.stats().idle == 2, 10, "2 workers up")
        started = pool.stats().started
        victim = pool.stats().workers[0].process
        os.kill(victim.pid, signal.SIGKILL)
        # minimum 2: the policy wants it back
        wait_for(lambda: pool.stats().lost == 1 and pool.stats().idle == 2, 10,
                 "the lost worker was replaced")
        assert pool.stats().started == started + 1
        # minimum 0, nothing queued: nobody wants them back (each kill a race between
        # the supervisor and the driver, which the target lowered in lose() settles)
        pool.adapt(minimum=0, maximum=3, idle_timeout=60.0)
        for lost in (2, 3):
            victim = pool.stats().workers[0].process
            os.kill(victim.pid, signal.SIGKILL)
            wait_for(lambda n=lost: pool.stats().lost == n, 10, "the worker was lost")
            time.sleep(0.3)  # several ticks
            stats = pool.stats()
            assert stats.started == started + 1 and counted(stats) == 3 - lost, stats
        assert pool.map(square, range(10)) == [x * x for x in range(10)]


def test_resize_turns_adapting_off():
    with fiber.Pool(1) as pool:
        pool.adapt(minimum=0, maximum=4, idle_timeout=0.2)
        pool.resize(2)
        assert pool.stats().adapt is None
        wait_for(lambda: pool.stats().idle == 2, 10, "2 workers up")
        time.sleep(0.6)  # three idle timeouts: nothing gives them back
        assert pool.stats().idle == 2 and pool.processes == 2


LOCAL = object()  # stands for fiber.get_context("local") in the table below


@pytest.mark.parametrize("kwargs, error, message", [
    ({"minimum": -1, "maximum": 2}, ValueError, "minimum must be at least 0, not -1"),
    ({"minimum": 1.5, "maximum": 2}, TypeError, "minimum must be an int, not float"),
    ({"minimum": 0, "maximum": 0}, ValueError, "maximum must be at least 1, not 0"),
    ({"minimum": 3, "maximum": 2}, ValueError, r"maximum \(2\) must be at least minimum \(3\)"),
    ({"maximum": 9}, ValueError, r"maximum \(9\) is above the pool's max_processes \(8\)"),
    ({"maximum": 2, "idle_timeout": -1}, ValueError, "idle_timeout must be a finite number"),
    ({"maximum": 2, "idle_timeout": "1"}, TypeError, "idle_timeout must be a number, not str"),
    ({"maximum": 2, "growth": 0}, ValueError, "growth must be a finite number above 0"),
    # placements (LOCAL: the local context, put in by the test)
    ({"placements": [("local", 2)]}, TypeError,
     r"placements must be a list of \(context, maximum\) pairs"),
    ({"placements": "local"}, TypeError, r"placements must be a list of \(context, maximum\)"),
    ({"placements": [(LOCAL, -1)]}, ValueError,
     "a placement's maximum must be at least 1, not -1"),
    ({"placements": [(LOCAL, 2.0)]}, TypeError, "a placement's maximum must be an int, not float"),
    ({"placements": []}, ValueError, r"placements must name at least one \(context, maximum\)"),
    ({"placements": [(LOCAL, 2), (LOCAL, 3)]}, ValueError,
     r"placements 0 and 1 are the same backend \(local\): name each context once"),
    ({"maximum": 6, "placements": [(LOCAL, 2)]}, ValueError,
     r"maximum \(6\) is above the placements' maxima together \(2\)"),
])
def test_bad_arguments_raise_at_the_call(kwargs, error, message):
    if "placements" in kwargs and isinstance(kwargs["placements"], list):
        local = fiber.get_context("local")
        kwargs = {**kwargs, "placements": [(local if c is LOCAL else c, n)
                                           for c, n in kwargs["placements"]]}
    with fiber.Pool(1, max_processes=8) as pool:
        with pytest.raises(error, match=message):
            pool.adapt(**kwargs)
        assert pool.stats().adapt is None


def test_adapt_on_a_closed_pool_raises():
    pool = fiber.Pool(1)
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.adapt(maximum=2)
    pool.join()


def test_the_driver_does_not_keep_the_pool_alive():
    """An adapting pool that is dropped is collected (the driver holds it weakly), and
    its driver ends."""
    import gc
    import warnings

    pool = fiber.Pool(1)
    before = threading.enumerate()
    pool.adapt(minimum=0, maximum=2)
    driver = adapt_thread(before)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        del pool
        gc.collect()
    driver.join(5)
    assert not driver.is_alive()
    wait_for(lambda: not alive_workers(), 10, "the collected pool's workers exited")
    assert threading.active_count() >= 1


def test_stats_and_top_show_the_adapt_state():
    """In-process: the snapshot ``fiber top`` gets (runtime/status.py) and its view
    carry the settings, the wanted size and the last decisions with their reasons."""
    from rich.console import Console

    from fiber import top
    from fiber.runtime import status

    with fiber.Pool(1) as pool:
        pool.adapt(minimum=0, maximum=3, idle_timeout=0.2, growth=1.5)
        assert pool.map(nap_square, range(12), chunksize=1) == [x * x for x in range(12)]
        wait_for(lambda: counted(pool.stats()) == 0, 10, "the pool gave back its workers")
        stats = pool.stats()
        assert (stats.adapt.minimum, stats.adapt.maximum, stats.adapt.idle_timeout,
                stats.adapt.growth, stats.adapt.wanted) == (0, 3, 0.2, 1.5, 0)
        reasons = [reason for _, reason in stats.adapt.decisions]
        assert any(r.startswith("start ") for r in reasons), reasons
        assert reasons[-1].startswith("give back ") and "wanted 0 in [0, 3]" in reasons[-1]
        view = status.pool_status(1, stats)
        assert view["adapt"]["wanted"] == 0 and view["adapt"]["decisions"]
        snap = {"program": {"pid": 1, "run": "r", "backend": "local", "since": 0,
                            "argv": ["x"]}, "time": 1.0, "pools": [view]}
        console = Console(width=200, record=True)
        console.print(top.render(snap, []))
        text = console.export_text()
        assert "adapting [0, 3] idle timeout 0.2 s, growth 1.5: wanted 0" in text, text
        assert reasons[-1][:60] in text, text


def test_workers_per_job_jobs_end_with_their_last_worker():
    """workers_per_job=2: the pool still counts workers; once both workers of each job
    are given back, the jobs end, and the next map starts new ones."""
    with fiber.Pool(2, workers_per_job=2) as pool:
        pool.adapt(minimum=0, maximum=4, idle_timeout=0.3)
        assert pool.map(nap_square, range(16), chunksize=1) == [x * x for x in range(16)]
        wait_for(lambda: counted(pool.stats()) == 0 and pool.stats().stopping == 0, 10,
                 "the pool gave back every worker")
        wait_for(lambda: not alive_workers(), 10, "every job exited")
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
        assert pool.stats().lost == 0
