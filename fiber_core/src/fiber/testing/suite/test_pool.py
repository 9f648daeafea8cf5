"""fiber.Pool on the selected backend: the multiprocessing.Pool API, errors with
remote tracebacks, dead workers, poison tasks, resizing, cleanup."""

from __future__ import annotations

import itertools
import os
import random
import threading
import time

import pytest

import fiber


def square(x):
    return x * x


def slow_square(x):
    time.sleep(0.002)
    return x * x


def slower_square(x):
    time.sleep(0.02)
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError(f"three is bad ({x})")
    return x


def die_on_seven(x):
    if x == 7:
        os._exit(13)
    return x


def pid_of(_):
    time.sleep(0.05)
    return os.getpid()


def _init(value):
    global INIT_VALUE
    INIT_VALUE = value


def read_init(_):
    return INIT_VALUE


def _connected(pool):
    """The workers of ``pool`` that are up (connected, not let go)."""
    return [w for w in pool.stats().workers if w.state in ("idle", "busy")]


def _wait_connected(pool, n, timeout=240):
    """Wait until ``n`` workers have connected (cluster backends start them slowly)."""
    deadline = time.monotonic() + timeout
    while len(_connected(pool)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} workers connected"
        time.sleep(0.05)


@pytest.fixture
def pool():
    p = fiber.Pool(3)
    yield p
    p.terminate()
    p.join()


def test_map_apply_starmap_imap(pool):
    assert pool.map(square, range(50)) == [x * x for x in range(50)]
    assert pool.map(square, range(50), chunksize=1) == [x * x for x in range(50)]
    assert pool.map(square, []) == []
    assert pool.apply(square, (9,)) == 81
    assert pool.apply(int, ("ff",), {"base": 16}) == 255
    assert pool.starmap(pow, [(2, 5), (3, 2)]) == [32, 9]
    assert pool.starmap_async(pow, [(2, 2)]).get(60) == [4]
    assert list(pool.imap(square, range(20), chunksize=3)) == [x * x for x in range(20)]
    assert sorted(pool.imap_unordered(slow_square, range(20))) == sorted(
        x * x for x in range(20))
    assert pool.map(lambda x: x + 1, range(5)) == [1, 2, 3, 4, 5]


def test_imap_pulls_its_input_lazily(pool):
    """An endless input: imap and imap_unordered yield as results come, pulling the
    input only a bounded window ahead of what was read."""
    from fiber.runtime.pool import feeder, results

    pulled = []

    def endless():
        for i in itertools.count():
            pulled.append(i)
            yield i

    it = pool.imap(square, endless(), chunksize=2)
    assert [next(it) for _ in range(50)] == [x * x for x in range(50)]
    time.sleep(0.5)  # a slow reader: the feeder waits for it
    assert len(pulled) - 50 <= feeder.window(pool.processes, 2) * 2 + results.BUFFER
    un = pool.imap_unordered(square, itertools.count())
    got = [next(un) for _ in range(50)]
    assert len(set(got)) == 50 and all(int(v ** 0.5) ** 2 == v for v in got)


def test_async_results_and_callbacks(pool):
    seen, errors = [], []
    r = pool.apply_async(square, (4,), callback=seen.append)
    assert r.get(60) == 16 and r.ready() and r.successful()
    m = pool.map_async(square, range(5), callback=seen.append)
    m.wait(60)
    assert m.get() == [0, 1, 4, 9, 16]
    e = pool.apply_async(fail_on_three, (3,), error_callback=errors.append)
    with pytest.raises(ValueError, match="three is bad"):
        e.get(60)
    assert not e.successful()
    assert seen == [16, [0, 1, 4, 9, 16]]
    assert len(errors) == 1 and isinstance(errors[0], ValueError)
    slow = pool.apply_async(time.sleep, (5,))
    with pytest.raises(fiber.TimeoutError):
        slow.get(0.1)
    with pytest.raises(ValueError):
        slow.successful()
    it = pool.imap(time.sleep, [5])
    with pytest.raises(fiber.TimeoutError):
        it.next(timeout=0.1)


def test_task_exception_has_remote_traceback_and_worker_survives(pool):
    with pytest.raises(ValueError) as info:
        pool.map(fail_on_three, range(6), chunksize=1)
    assert "fail_on_three" in str(info.value.__cause__)
    assert pool.map(square, range(3)) == [0, 1, 4]


def test_initializer_runs_in_every_worker():
    with fiber.Pool(2, initializer=_init, initargs=("ready",)) as p:
        assert set(p.map(read_init, range(6))) == {"ready"}


def test_maxtasksperchild_replaces_workers():
    with fiber.Pool(2, maxtasksperchild=2) as p:
        pids = p.map(pid_of, range(8), chunksize=1)
        assert len(set(pids)) >= 4
        # as multiprocessing: a worker runs at most maxtasksperchild tasks
        assert max(pids.count(pid) for pid in pids) <= 2


def test_context_manager_and_close_join():
    p = fiber.Pool(2)
    results = p.map_async(square, range(10))
    p.close()
    with pytest.raises(ValueError):
        p.apply_async(square, (1,))
    p.join()
    assert results.get(1) == [x * x for x in range(10)]
    assert not any(c.is_alive() for c in fiber.active_children())
    with pytest.raises(ValueError):
        fiber.Pool(0)


@pytest.mark.slow
def test_killed_workers_lose_nothing():
    """Workers are killed at random (job ends with SIGKILL) during a long map; the
    pool requeues their tasks and replaces them: the result equals the serial one."""
    local = os.environ.get("FIBER_BACKEND", "local") == "local"
    # on cluster backends a replacement job takes seconds to start: kill less often
    n = int(os.environ.get("FIBER_TEST_KILL_TASKS", "10000" if local else "2000"))
    interval = 0.4 if local else 3.0
    task = slow_square if local else slower_square  # the map lasts several kills
    pool = fiber.Pool(4)
    _wait_connected(pool, 4)
    stop = threading.Event()
    kills = []

    def killer():
        rnd = random.Random(7)
        while not stop.wait(interval):
            live = [w for w in _connected(pool) if w.process is not None]
            if live:
                victim = rnd.choice(live)
                victim.process.kill()
                kills.append(victim.id)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        result = pool.map(task, range(n), chunksize=1)
    finally:
        stop.set()
        thread.join()
        pool.terminate()
        pool.join()
    assert result == [x * x for x in range(n)]
    assert len(kills) >= 2


def test_poison_task_fails_alone():
    with fiber.Pool(2, max_task_attempts=3) as p:
        r = p.map_async(die_on_seven, range(12), chunksize=3)
        with pytest.raises(fiber.WorkerLostError, match="item 7"):
            r.get(180)
        ok = p.apply_async(die_on_seven, (1,))
        poison = p.apply_async(die_on_seven, (7,))
        assert ok.get(120) == 1
        with pytest.raises(fiber.WorkerLostError):
            poison.get(180)
        assert p.map(square, range(4)) == [0, 1, 4, 9]


def test_resize_grow_and_shrink():
    p = fiber.Pool(1, max_processes=4)
    try:
        assert p.map(square, range(4)) == [0, 1, 4, 9]
        p.resize(3)
        _wait_connected(p, 3)
        pids = set(p.map(pid_of, range(30), chunksize=1))
        assert len(pids) >= 2
        p.resize(1)
        assert p.map(square, range(10)) == [x * x for x in range(10)]
        deadline = time.monotonic() + 60
        while len(p.stats().workers) > 1:
            assert time.monotonic() < deadline, "shrunk workers did not exit"
            time.sleep(0.1)
        with pytest.raises(ValueError):
            p.resize(5)
    finally:
        p.terminate()
        p.join()


def test_terminate_ends_every_worker():
    p = fiber.Pool(3)
    p.map(square, range(10))
    # The map can end before the slower workers have started (one worker can
    # take all ten tasks on a loaded machine): wait until every one is up, so
    # that terminate() has three running workers to end.
    _wait_connected(p, 3)
    workers = [w.process for w in p.stats().workers]
    assert len(workers) == 3 and None not in workers
    pending = p.apply_async(time.sleep, (30,))
    p.terminate()
    p.join()
    for proc in workers:
        assert proc.exitcode is not None
    with pytest.raises(ValueError):
        pending.get(10)


def test_two_pools_at_once():
    with fiber.Pool(2) as a, fiber.Pool(2) as b:
        ra = a.map_async(square, range(20))
        rb = b.map_async(slow_square, range(20))
        assert ra.get(120) == rb.get(120)


def _pool_worker_processes(p):
    return [w.process for w in p.stats().workers if w.process is not None]


def test_garbage_collected_pool_ends_its_workers():
    import gc

    p = fiber.Pool(2)
    assert p.map(square, range(4)) == [0, 1, 4, 9]
    workers = _pool_worker_processes(p)
    assert workers and all(w.is_alive() for w in workers)
    # as multiprocessing's: a running pool left to the GC says so (the record of the
    # warning holds the pool until the block ends)
    with pytest.warns(ResourceWarning,
                      match=r"^unclosed running multiprocessing pool <fiber\.Pool "):
        del p
        gc.collect()
    gc.collect()
    deadline = time.monotonic() + 60
    while any(w.exitcode is None for w in workers):
        assert time.monotonic() < deadline, "workers of a collected pool are still running"
        time.sleep(0.1)


@pytest.mark.slow
def test_many_workers_on_sleeping_tasks():
    """More workers than this machine has cores by far: 256 locally (fewer on cluster
    backends, whose test engines are small), each running sleeping tasks."""
    n = int(os.environ.get("FIBER_TEST_MANY_WORKERS",
                           "256" if os.environ.get("FIBER_BACKEND", "local") == "local" else "16"))
    with fiber.Pool(n) as p:
        pids = set()
        deadline = time.monotonic() + 240
        while len(pids) < n:
            assert time.monotonic() < deadline, f"only {len(pids)} of {n} workers ran a task"
            pids.update(p.map(pid_of, range(n), chunksize=1))
        started = time.monotonic()
        assert p.map(time.sleep, [0.5] * n, chunksize=1) == [None] * n
        assert time.monotonic() - started < 30  # in parallel, not one after another
