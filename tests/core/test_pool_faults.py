"""A lost pool worker loses only what it was running: results go back as tasks finish,
so a killed worker's finished tasks are not run again (issue #17).

Real processes on the local backend: a real pool, real SIGKILLs of its own workers
(by pid, from ``Pool.stats()``), executions counted in a real file opened with
``O_APPEND``.
"""

from __future__ import annotations

import collections
import functools
import os
import random
import signal
import threading
import time

import fiber


def record(path: str, i: int) -> int:
    """A task of 1-5 ms that records its execution once it is complete (a task killed
    in the middle records nothing)."""
    time.sleep((1 + (i * 7919) % 5) / 1000)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i


def wait_for_flag(path: str, i: int) -> bool:
    """Item 0 returns at once; item 1 waits (up to 30 s) for the parent to create
    ``path``, which it does once it has the result of item 0."""
    if i != 1:
        return True
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(0.01)
    return False


def test_killed_workers_rerun_only_their_tasks_in_progress(tmp_path):
    """Pool(4) maps 3,000 tasks of 1-5 ms (chunksize=1, so batches of many tasks) while
    a thread SIGKILLs one of the pool's connected workers every 0.2 s, five times.
    Every result arrives once and right; a task runs again only if it was in progress
    when its worker died, or if its result was on its way then: at most one duplicate
    execution per kill (when a batch's results came back with the batch, each kill
    re-ran the tens of tasks of the batch that had finished)."""
    log = tmp_path / "executions"
    n = 3000
    kills: list[int] = []
    with fiber.Pool(4) as pool:
        pool.map(abs, range(8))  # the workers are up
        stop = threading.Event()

        def killer() -> None:
            rnd = random.Random(17)
            while len(kills) < 5 and not stop.wait(0.2):
                live = [w.process.pid for w in pool.stats().workers
                        if w.state == "busy" and w.process is not None
                        and w.process.pid and w.process.pid not in kills]
                if live:
                    pid = rnd.choice(live)
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)

        thread = threading.Thread(target=killer)
        thread.start()
        try:
            result = pool.map(functools.partial(record, str(log)), range(n), chunksize=1)
        finally:
            stop.set()
            thread.join()
        stats = pool.stats()
    assert result == [i * i for i in range(n)]
    assert len(kills) == 5, "the map ended before five workers were killed"
    assert stats.lost >= len(kills)
    runs = collections.Counter(int(line) for line in log.read_text().split())
    assert set(runs) == set(range(n))  # every task ran to its end
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= len(kills), (duplicates, sorted(i for i, c in runs.items() if c > 1))


def test_a_result_comes_back_before_its_batch_ends(tmp_path):
    """A pool of one worker takes 20 items in batches (the first is 1 + 19 // 2 = 10
    tasks: batches grow with the queue): item 1 waits for a file that the parent
    creates only once ``imap`` has yielded item 0, so the batch ends only if item 0's
    result came back before it did."""
    flag = tmp_path / "flag"
    with fiber.Pool(1) as pool:
        pool.map(abs, range(2))  # the worker is up
        it = pool.imap(functools.partial(wait_for_flag, str(flag)), range(20), chunksize=1)
        started = time.monotonic()
        assert it.next(timeout=20) is True
        waited = time.monotonic() - started
        flag.touch()
        assert list(it) == [True] * 19
    assert waited < 20
