"""fiber.synchronize's primitives shared by two job-backed processes and their parent
on the selected backend: Lock and RLock exclude, a Semaphore counts, an Event wakes,
a Condition notifies, a Barrier meets. Each test reports the path the children took:
``native`` (named semaphores on the creator's host: the local backend) or ``creator``
(each operation a round trip to the process that made them: another host, container
or pod)."""

from __future__ import annotations

import time

import pytest

import fiber
from fiber import synchronize

pytestmark = pytest.mark.timeout(300)


def _expected_path(fiber_backend):
    """The path the children must take, if this backend decides it."""
    if not fiber.get_config_value("shared_memory"):
        return "creator"  # FIBER_SHARED_MEMORY=false: the path of other hosts
    return "native" if fiber_backend["backend"] == "local" else None


def _run(target, *args, n=2):
    q = fiber.Queue()
    procs = [fiber.Process(target=target, args=(i, q, *args)) for i in range(n)]
    for p in procs:
        p.start()
    return q, procs


def _join(procs):
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def _check_paths(paths, fiber_backend):
    assert len(set(paths)) == 1 and paths[0] in ("native", "creator"), paths
    print(f"path taken by the children: {paths[0]}")
    expected = _expected_path(fiber_backend)
    if expected is not None:
        assert paths[0] == expected


def _exclusive(i, q, lock, rlock):
    q.put(synchronize.shared_path(lock))
    for _ in range(5):
        with lock:
            q.put(("lock", "enter", i))
            time.sleep(0.005)
            q.put(("lock", "exit", i))
        with rlock:
            with rlock:
                q.put(("rlock", "enter", i))
                time.sleep(0.005)
                q.put(("rlock", "exit", i))


def test_lock_and_rlock_exclude(fiber_backend):
    lock, rlock = fiber.Lock(), fiber.RLock()
    q, procs = _run(_exclusive, lock, rlock)
    items = [q.get(120) for _ in range(2 + 2 * 2 * 5 * 2)]
    _join(procs)
    _check_paths([x for x in items if isinstance(x, str)], fiber_backend)
    for which in ("lock", "rlock"):
        events = [x[1:] for x in items if not isinstance(x, str) and x[0] == which]
        assert len(events) == 2 * 5 * 2
        for enter, leave in zip(events[::2], events[1::2], strict=True):  # no interleaving
            assert enter[0] == "enter" and leave == ("exit", enter[1])
    assert lock.acquire(False) and rlock.acquire(False)


def _signals(i, q, sem, event, cond, flag, barrier):
    q.put(synchronize.shared_path(sem))
    sem.release()
    q.put(("event", event.wait(120)))
    with cond:
        q.put(("condition", cond.wait_for(flag.is_set, 120)))
    q.put(("barrier", barrier.wait(120)))


def test_semaphore_event_condition_barrier(fiber_backend):
    sem, event, cond, flag = fiber.Semaphore(0), fiber.Event(), fiber.Condition(), \
        fiber.Event()
    barrier = fiber.Barrier(3, timeout=120)
    q, procs = _run(_signals, sem, event, cond, flag, barrier)
    assert sem.acquire(timeout=120) and sem.acquire(timeout=120)  # one from each child
    assert not sem.acquire(timeout=0.05)
    event.set()
    with cond:
        flag.set()
        cond.notify_all()
    index = barrier.wait(120)
    items = [q.get(120) for _ in range(2 * 4)]
    _join(procs)
    _check_paths([x for x in items if isinstance(x, str)], fiber_backend)
    got = sorted(x for x in items if not isinstance(x, str))
    indices = sorted([index] + [v for k, v in got if k == "barrier"])
    assert indices == [0, 1, 2]
    assert [x for x in got if x[0] != "barrier"] == [("condition", True)] * 2 + \
        [("event", True)] * 2
    assert barrier.n_waiting == 0 and not barrier.broken
