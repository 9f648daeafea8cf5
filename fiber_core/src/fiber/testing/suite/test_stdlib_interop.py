"""fiber with the standard library's processes and executors, on the selected backend
(``--backend``): ``concurrent.futures.ProcessPoolExecutor`` whose workers are jobs, and
standard-library children started *inside a job* that use objects of the main process
(so, on a cluster, across hosts)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import signal

import pytest

import fiber
from fiber.runtime import run


def _square(x):
    return x * x


def _job_identity(_):
    return run.is_job(), fiber.current_process().name, os.getpid()


def _fail(x):
    raise KeyError(x)


def _die(_):
    os.kill(os.getpid(), signal.SIGKILL)


def test_process_pool_executor_runs_its_workers_as_jobs():
    with cf.ProcessPoolExecutor(2, mp_context=fiber.get_context()) as executor:
        assert list(executor.map(_square, range(50), chunksize=4)) == \
            [x * x for x in range(50)]
        identities = list(executor.map(_job_identity, range(6)))
        assert all(is_job for is_job, _, _ in identities)
        with pytest.raises(KeyError):
            executor.submit(_fail, "missing").result(timeout=120)
        assert executor.submit(_square, 9).result(timeout=120) == 81
    assert fiber.active_children() == []


def test_process_pool_executor_breaks_when_a_worker_is_killed():
    from concurrent.futures.process import BrokenProcessPool

    executor = cf.ProcessPoolExecutor(1, mp_context=fiber.get_context("spawn"))
    try:
        with pytest.raises(BrokenProcessPool):
            executor.submit(_die, None).result(timeout=120)
    finally:
        executor.shutdown(wait=True)
    assert fiber.active_children() == []


def _grandchild(q, conn, lock, counter):
    q.put(("grandchild", os.getpid()))
    conn.send(conn.recv() * 2)
    with lock:
        counter.value += 1


def _job_starts_stdlib_child(method, q, conn, lock, counter):
    child = multiprocessing.get_context(method).Process(
        target=_grandchild, args=(q, conn, lock, counter))
    child.start()
    child.join(120)
    q.put(("exitcode", child.exitcode))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_stdlib_child_of_a_job_uses_the_main_process_objects(method):
    q = fiber.Queue()
    mine, theirs = fiber.Pipe()
    lock, counter = fiber.Lock(), fiber.Value("i", 0)
    job = fiber.Process(target=_job_starts_stdlib_child,
                        args=(method, q, theirs, lock, counter))
    job.start()
    kind, pid = q.get(timeout=120)
    assert kind == "grandchild"
    mine.send(21)
    assert mine.recv() == 42
    assert q.get(timeout=120) == ("exitcode", 0)
    job.join(120)
    assert job.exitcode == 0
    assert counter.value == 1


def _forked_grandchild(q, own):
    own.put("from the forked child")          # its parent's (the job's) queue: works
    q.put("to the main process")  # the job reaches the main process by its stream wire
    try:
        fiber.Queue()  # a queue of its own needs a hub, so nng: unusable after a fork
    except Exception as exc:  # noqa: BLE001 - reported to the test
        own.put(type(exc).__name__)


def _job_forks(q):
    own = fiber.Queue()
    child = multiprocessing.get_context("fork").Process(target=_forked_grandchild,
                                                        args=(q, own))
    child.start()
    q.put(own.get(timeout=60))
    q.put(own.get(timeout=60))
    child.join(60)
    q.put(child.exitcode)


def test_forked_child_of_a_job_reaches_what_the_job_reaches_and_says_what_it_cannot():
    """A child forked by a job reaches the objects of its parent (the job) and of the
    main process, which the job reaches by the stream wire as the child does; creating
    an object of its own raises ForkedProcessError."""
    q = fiber.Queue()
    job = fiber.Process(target=_job_forks, args=(q,))
    job.start()
    got = {q.get(timeout=120), q.get(timeout=120)}  # (the two arrive in either order)
    assert got == {"from the forked child", "to the main process"}
    assert q.get(timeout=120) == "ForkedProcessError"
    assert q.get(timeout=120) == 0
    job.join(120)
    assert job.exitcode == 0
    assert q.empty()
