"""Lock, RLock, Semaphore, Condition, Event and Barrier shared with job-backed processes
on the selected backend: a child on the creator's host opens the same kernel
semaphores, one on another host (a container, a node, a pod) uses the objects through
their creator; the semantics are the same either way. Each test reports the path the
children took."""

from __future__ import annotations

import time

import pytest

import fiber
from fiber import synchronize

pytestmark = pytest.mark.timeout(300)


def _expected_path() -> str | None:
    """Native on the local backend, through the creator with the shared_memory setting
    off; elsewhere it depends on where the jobs run."""
    if not fiber.get_config_value("shared_memory"):
        return "creator"
    return "native" if fiber.get_config_value("backend") == "local" else None


def _check_paths(paths: set[str], record_property) -> None:
    print(f"synchronize path of the children: {sorted(paths)}")
    record_property("synchronize_path", ",".join(sorted(paths)))
    assert paths <= {"native", "creator"}
    expected = _expected_path()
    if expected is not None:
        assert paths == {expected}


def _exclusive(lock, rlock, sem, inside, q):
    q.put(synchronize._path(lock))
    for _ in range(20):
        with lock:
            with rlock:
                with rlock:  # recursive: the same thread again
                    inside.put(1)
                    time.sleep(0.001)
                    inside.put(-1)
    assert sem.acquire(timeout=60)
    sem.release()


def test_locks_exclude_across_processes(record_property):
    lock, rlock, sem = fiber.Lock(), fiber.RLock(), fiber.BoundedSemaphore(1)
    inside, q = fiber.Queue(), fiber.Queue()
    procs = [fiber.Process(target=_exclusive, args=(lock, rlock, sem, inside, q))
             for _ in range(2)]
    for p in procs:
        p.start()
    paths = {q.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    _check_paths(paths, record_property)
    depth, deepest = 0, 0
    for _ in range(80):  # the +1/-1 marks never overlap: one holder at a time
        depth += inside.get(timeout=60)
        deepest = max(deepest, depth)
    assert (depth, deepest) == (0, 1)
    assert sem.get_value() == 1 and repr(lock) == "<Lock(owner=None)>"


def _party(cond, event, barrier, out):
    out.put(("path", synchronize._path(event)))
    with cond:
        out.put(("woken", bool(cond.wait_for(event.is_set, 120))))
    out.put(("index", barrier.wait(120)))


def test_condition_event_barrier_across_processes(record_property):
    cond, event, barrier, out = fiber.Condition(), fiber.Event(), fiber.Barrier(3), fiber.Queue()
    procs = [fiber.Process(target=_party, args=(cond, event, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in range(2)]  # both started
    with cond:
        event.set()
        cond.notify_all()
    own = barrier.wait(120)
    got += [out.get(timeout=120) for _ in range(4)]
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    _check_paths({v for k, v in got if k == "path"}, record_property)
    assert [v for k, v in got if k == "woken"] == [True, True]
    assert sorted([own] + [v for k, v in got if k == "index"]) == [0, 1, 2]
    assert event.is_set() and not barrier.broken
