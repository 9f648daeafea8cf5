"""Pool.stats(): the public snapshot of a pool's workers and tasks (and the
multiprocessing-compatible ``Pool._pool``/``Pool._processes``)."""

from __future__ import annotations

import threading
import time

import pytest

import fiber
from fiber.pool import PoolStats, WorkerStats


def square(x):
    return x * x


def fail(x):
    raise KeyError(x)


def nap(seconds):
    time.sleep(seconds)
    return seconds


def wait_for(pool, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        stats = pool.stats()
        if predicate(stats):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.02)


def test_counts_of_workers_and_tasks():
    with fiber.Pool(2) as pool:
        stats = pool.stats()
        assert isinstance(stats, PoolStats) and stats.state == "RUN"
        assert stats.processes == 2 and stats.started == 2
        assert len(stats.workers) == 2 and all(isinstance(w, WorkerStats)
                                               for w in stats.workers)
        stats = wait_for(pool, lambda s: s.idle == 2)
        assert (stats.starting, stats.busy, stats.stopping) == (0, 0, 0)
        assert all(w.process is not None and w.process.is_alive() for w in stats.workers)
        assert pool.map(square, range(10), chunksize=1) == [x * x for x in range(10)]
        with pytest.raises(KeyError):
            pool.apply(fail, (1,))
        stats = pool.stats()
        assert (stats.done, stats.failed) == (10, 1)
        assert (stats.queued, stats.running, stats.held) == (0, 0, 0)
        assert sum(w.dispatched for w in stats.workers) == 11
        # a task running: one worker busy, holding it
        slow = pool.apply_async(nap, (1.0,))
        stats = wait_for(pool, lambda s: s.busy == 1)
        assert (stats.running, stats.held, stats.idle) == (1, 1, 1)
        (busy,) = [w for w in stats.workers if w.state == "busy"]
        assert (busy.batches, busy.held) == (1, 1)
        assert slow.get(30) == 1.0
        with pytest.raises(AttributeError):
            stats.done = 0  # a snapshot: frozen


def test_a_killed_worker_counts_as_lost_and_replaced():
    with fiber.Pool(2) as pool:
        stats = wait_for(pool, lambda s: s.idle == 2)
        victim = stats.workers[0]
        victim.process.kill()
        stats = wait_for(pool, lambda s: s.lost == 1 and s.idle == 2)
        assert stats.replaced == 1 and stats.started == 3
        assert victim.id not in [w.id for w in stats.workers]
        assert pool.map(square, range(4)) == [0, 1, 4, 9]


def test_workers_let_go_are_stopping_not_lost():
    pool = fiber.Pool(3, max_processes=3)
    try:
        wait_for(pool, lambda s: s.idle == 3)
        pool.resize(1)
        stats = pool.stats()
        assert stats.processes == 1 and stats.idle + stats.stopping == 3
        stats = wait_for(pool, lambda s: len(s.workers) == 1)
        assert stats.lost == 0 and stats.replaced == 0
        pool.close()
        pool.join()
        stats = pool.stats()
        assert stats.state == "CLOSE" and stats.workers == () and stats.lost == 0
    finally:
        pool.terminate()
        pool.join()


def test_terminate_counts_the_tasks_it_fails():
    pool = fiber.Pool(1)
    wait_for(pool, lambda s: s.idle == 1)
    pending = [pool.apply_async(nap, (30,)) for _ in range(3)]
    wait_for(pool, lambda s: s.busy == 1)
    pool.terminate()
    pool.join()
    for result in pending:
        with pytest.raises(ValueError):
            result.get(10)
    stats = pool.stats()
    assert stats.state == "TERMINATE" and stats.failed == 3 and stats.done == 0
    assert stats.queued == 0 and stats.lost == 0


def test_stats_from_another_thread_while_tasks_flow():
    seen: list[PoolStats] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def watch(pool):
        try:
            while not stop.is_set():
                seen.append(pool.stats())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    with fiber.Pool(2) as pool:
        watcher = threading.Thread(target=watch, args=(pool,))
        watcher.start()
        try:
            assert pool.map(square, range(2000), chunksize=1) == [x * x for x in range(2000)]
        finally:
            stop.set()
            watcher.join()
        final = pool.stats()
    assert not errors and len(seen) > 1
    done = [s.done for s in seen]
    assert done == sorted(done) and final.done == 2000
    for s in seen:
        assert s.queued + s.held + s.done <= 2000
        assert s.starting + s.idle + s.busy + s.stopping == len(s.workers)


def test_multiprocessing_private_names():
    with fiber.Pool(2) as pool:
        # multiprocessing's own private names, which code in the wild reads: fiber keeps them
        assert pool._processes == 2
        wait_for(pool, lambda s: s.idle == 2)
        assert sorted(p.name for p in pool._pool) == ["PoolWorker-1", "PoolWorker-2"]
        assert pool.processes == 2 and pool.max_task_attempts >= 1


def test_stats_say_why_a_broken_pool_cannot_start_workers():
    """A pool whose workers cannot start (their Python exits at once) breaks; its
    stats carry the error every call raises, so a program that waits for workers by
    polling stats (examples/es.py) fails at once rather than wait out its own limit."""
    ctx = fiber.get_context("local", python="/bin/false")
    with fiber.Pool(2, context=ctx) as pool:
        deadline = time.monotonic() + 60
        while pool.stats().broken is None:
            assert time.monotonic() < deadline, pool.stats()
            time.sleep(0.05)
        broken = pool.stats().broken
        assert isinstance(broken, fiber.ProcessStartError), broken
        with pytest.raises(fiber.ProcessStartError):
            pool.map(abs, [1])
