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


def _connected(stats):
    return [w for w in stats.workers if w.state in ("idle", "busy")]


def _worker(stats, wid):
    (w,) = [w for w in stats.workers if w.id == wid]
    return w


def test_first_worker_does_not_take_the_starting_workers_tasks(tmp_path):
    pool = fiber.Pool(4, initializer=_slow_unless_first, initargs=(str(tmp_path / "m"),))
    try:
        deadline = time.monotonic() + 60
        while not _connected(pool.stats()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        (first,) = _connected(pool.stats())
        few = pool.map_async(_nap, range(4), chunksize=1)
        time.sleep(0.2)
        stats = pool.stats()  # one snapshot, taken under the pool's lock
        assert stats.starting == 3
        assert _worker(stats, first.id).held == 1, \
            "the first worker took tasks the starting ones will run"
        assert stats.queued == 3
        # a long queue: more than the starting workers will take, so it prefetches
        many = pool.map_async(_nap, range(40), chunksize=1)
        time.sleep(0.7)
        stats = pool.stats()
        if stats.starting == 3:
            assert _worker(stats, first.id).batches == 2
        assert few.get(60) == list(range(4))
        assert many.get(120) == list(range(40))
        stats = pool.stats()
        assert len(_connected(stats)) == 4 and stats.starting == 0
    finally:
        pool.terminate()
        pool.join()
