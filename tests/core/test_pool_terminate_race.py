"""terminate() and join() end workers that were still being started.

A pool with ``maxtasksperchild=1`` starts replacement workers all the time; a
terminate() that lands while one of them is being started used to miss it: the worker
outlived the pool, found the pool's channel gone and died with a traceback (and a
``with Pool() as p:`` block returned before such a worker ended). Both are checked here, many times over, because the window is a few milliseconds wide.
"""

from __future__ import annotations

import os
import time

import fiber


def pid_after_nap(_):
    time.sleep(0.02)
    return os.getpid()


def test_terminate_ends_workers_that_were_starting(capfd):
    leftovers = 0
    for _ in range(15):
        pool = fiber.Pool(2, maxtasksperchild=1)
        assert len(pool.map(pid_after_nap, range(4), chunksize=1)) == 4
        pool.terminate()  # as multiprocessing's, it returns once the workers are gone
        alive = [c for c in fiber.active_children() if c.is_alive()]
        leftovers += len(alive)
        pool.join()
        for child in alive:  # keep later rounds independent
            child.terminate()
            child.join(10)
    assert leftovers == 0
    assert "Traceback" not in capfd.readouterr().err


def test_close_join_waits_for_workers_being_replaced():
    # a closed pool whose last result came from a worker at its maxtasksperchild limit
    # must still stop the idle replacement workers (join() used to hang on them)
    for _ in range(10):
        pool = fiber.Pool(2, maxtasksperchild=1)
        result = pool.map_async(pid_after_nap, range(4), chunksize=1)
        pool.close()
        pool.join()
        assert len(result.get(0)) == 4
        assert not [c for c in fiber.active_children() if c.is_alive()]
