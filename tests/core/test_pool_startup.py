"""While some of a pool's workers are still starting, the first ones up do not take
tasks in advance that the others would run: a busy worker prefetches only when the
queue holds more than the starting workers will take."""

from __future__ import annotations

import os
import time

import fiber


def _slow_unless_first(marker: str) -> None:
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        time.sleep(3.0)  # every worker but the first connects late


def _nap(x):
    time.sleep(0.5)
    return x


def _connected(pool):
    return [w for w in list(pool._workers.values()) if w.connected and w.alive]


def test_first_worker_does_not_take_the_starting_workers_tasks(tmp_path):
    pool = fiber.Pool(4, initializer=_slow_unless_first, initargs=(str(tmp_path / "m"),))
    try:
        deadline = time.monotonic() + 60
        while not _connected(pool):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (first,) = _connected(pool)
        few = pool.map_async(_nap, range(4), chunksize=1)
        time.sleep(0.2)
        with pool._lock:
            assert pool._starting == 3
            held = sum(len(batch) for batch in first.held.values())
            assert held == 1, "the first worker took tasks the starting ones will run"
            assert len(pool._queue) == 3
        # a long queue: more than the starting workers will take, so it prefetches
        many = pool.map_async(_nap, range(40), chunksize=1)
        time.sleep(0.7)
        with pool._lock:
            if pool._starting == 3:
                assert len(first.held) == 2
        assert few.get(60) == list(range(4))
        assert many.get(120) == list(range(40))
        assert len(_connected(pool)) == 4 and pool._starting == 0
    finally:
        pool.terminate()
        pool.join()
