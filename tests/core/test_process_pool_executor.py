"""``concurrent.futures.ProcessPoolExecutor`` on a fiber context: its workers are fiber
Processes (jobs of the selected backend, here the local one), fed through the
executor's own queues (its call queue, a ``multiprocessing.queues.Queue``, reaches the
jobs as a fiber queue fed by the parent; its result queue is a fiber SimpleQueue whose
``_reader`` the executor waits on with ``multiprocessing.connection.wait``)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

import fiber
from fiber.runtime import run


def _square(x):
    return x * x


def _whoami(_):
    return os.getpid(), run.is_job(), fiber.parent_process() is not None


def _fail(x):
    raise ValueError(f"bad {x}")


def _die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def _sleep(seconds):
    time.sleep(seconds)
    return seconds


_initialized = None


def _init(value):
    global _initialized
    _initialized = value


def _read_initialized(_):
    return _initialized


def _pid(_):
    return os.getpid()


def _no_bridge_threads():
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not [t for t in threading.enumerate() if t.name == "fiber-stdlib-queue"]:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("method", [None, "spawn", "forkserver"])
def test_map_and_submit(method):
    ctx = fiber.get_context(method)
    with cf.ProcessPoolExecutor(2, mp_context=ctx) as executor:
        assert list(executor.map(_square, range(20))) == [x * x for x in range(20)]
        assert list(executor.map(_square, range(10), chunksize=3)) == [x * x for x in range(10)]
        futures = [executor.submit(_square, x) for x in range(5)]
        assert [f.result(timeout=60) for f in futures] == [0, 1, 4, 9, 16]
    assert fiber.active_children() == []
    assert _no_bridge_threads()


def test_workers_are_fiber_jobs():
    with cf.ProcessPoolExecutor(2, mp_context=fiber.get_context("spawn")) as executor:
        answers = list(executor.map(_whoami, range(8)))
        children = {p.pid for p in fiber.active_children()}
    assert all(is_job for _, is_job, _ in answers)
    assert {pid for pid, _, _ in answers} <= children   # the parent's fiber children
    assert all(has_parent for _, _, has_parent in answers)


def test_task_exception_arrives_as_in_the_standard_library():
    with cf.ProcessPoolExecutor(1, mp_context=fiber.get_context()) as executor:
        future = executor.submit(_fail, 7)
        with pytest.raises(ValueError, match="bad 7") as info:
            future.result(timeout=60)
        # the worker's traceback, as concurrent.futures attaches it
        assert "_fail" in str(info.value.__cause__)
        assert type(info.value.__cause__).__name__ == "_RemoteTraceback"
        assert executor.submit(_square, 3).result(timeout=60) == 9   # the pool goes on


def test_killed_worker_breaks_the_pool():
    executor = cf.ProcessPoolExecutor(2, mp_context=fiber.get_context())
    assert executor.submit(_square, 2).result(timeout=60) == 4
    future = executor.submit(_die, None)
    with pytest.raises(BrokenProcessPool):
        future.result(timeout=60)
    with pytest.raises(BrokenProcessPool):
        executor.submit(_square, 2)
    started = time.monotonic()
    executor.shutdown(wait=True)
    assert time.monotonic() - started < 30
    assert fiber.active_children() == []
    assert _no_bridge_threads()


def test_initializer_and_max_tasks_per_child():
    with cf.ProcessPoolExecutor(1, mp_context=fiber.get_context("spawn"), initializer=_init,
                                initargs=("set",), max_tasks_per_child=2) as executor:
        assert executor.submit(_read_initialized, None).result(timeout=60) == "set"
        pids = [executor.submit(_pid, None).result(timeout=60) for _ in range(4)]
    assert len(set(pids)) >= 2           # a worker was replaced after its two tasks


def test_pending_work_is_cancelled_on_shutdown():
    executor = cf.ProcessPoolExecutor(1, mp_context=fiber.get_context())
    futures = [executor.submit(_sleep, 0.2) for _ in range(20)]
    executor.shutdown(wait=True, cancel_futures=True)
    done = [f for f in futures if not f.cancelled()]
    assert all(f.result() == 0.2 for f in done)
    assert any(f.cancelled() for f in futures)
    assert fiber.active_children() == []
