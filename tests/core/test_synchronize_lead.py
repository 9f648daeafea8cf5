"""fiber.synchronize's primitives against multiprocessing's, on the local backend: the
same calls give the same results in one process; across processes, children of this
host use the same kernel semaphores (the native path) and children with
``FIBER_SHARED_MEMORY=false`` use proxies of the creator's objects (the path of other
hosts), with the same semantics; a killed creator's holders get a clear error."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import threading
import time

import pytest

import fiber
from fiber import synchronize
from fiber.errors import ConnectionLostError
from fiber.wire import shm

MP = multiprocessing.get_context("fork")


def _mask(text: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x?", text).replace("fiber.synchronize", "M").replace(
        "multiprocessing.synchronize", "M")


@pytest.mark.parametrize("make", [
    lambda m: m.Lock(), lambda m: m.RLock(), lambda m: m.Semaphore(2),
    lambda m: m.BoundedSemaphore(2), lambda m: m.Condition(), lambda m: m.Event(),
    lambda m: m.Barrier(2),
], ids=["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier"])
def test_reprs_as_multiprocessing(make):
    ours, theirs = make(fiber), make(MP)
    assert _mask(repr(ours)) == _mask(repr(theirs))
    if hasattr(theirs, "acquire"):
        assert ours.acquire() == theirs.acquire()
        assert _mask(repr(ours)) == _mask(repr(theirs))
        ours.release()
        theirs.release()


def test_same_calls_same_results():
    for m in (fiber, MP):
        lock = m.Lock()
        assert lock.acquire(timeout=0.05) is True
        assert lock.acquire(True, 0.05) is False
        assert lock.acquire(False) is False
        lock.release()
        with pytest.raises(ValueError):
            lock.release()
        rlock = m.RLock()
        assert rlock.acquire() and rlock.acquire()
        rlock.release()
        rlock.release()
        with pytest.raises(AssertionError):
            rlock.release()
        sem = m.BoundedSemaphore(1)
        assert sem.acquire(timeout=0.01) is True and sem.acquire(timeout=0.01) is False
        sem.release()
        with pytest.raises(ValueError):
            sem.release()
        s = m.Semaphore(3)
        assert s.get_value() == 3
        event = m.Event()
        assert event.is_set() is False and event.wait(0.01) is False
        event.set()
        assert event.is_set() is True and event.wait(0.01) is True
        event.clear()
        assert not event.is_set()
        cond = m.Condition()
        with cond:
            assert cond.wait(0.01) is False
            assert cond.wait_for(lambda: 42, 0.01) == 42
            assert cond.wait_for(lambda: 0, 0.01) == 0
            cond.notify()
            cond.notify_all()
        with pytest.raises(AssertionError):
            cond.wait(0.01)
        barrier = m.Barrier(1, timeout=1)
        assert barrier.wait() == 0
        assert (barrier.parties, barrier.n_waiting, barrier.broken) == (1, 0, False)
        barrier.abort()
        assert barrier.broken
        with pytest.raises(threading.BrokenBarrierError):
            barrier.wait()
        barrier.reset()
        assert not barrier.broken


def _count_under_lock(lock, value_file, n, path_out):
    path_out.put(synchronize._path(lock))
    for _ in range(n):
        with lock:
            with open(value_file) as f:
                v = int(f.read() or 0)
            with open(value_file, "w") as f:
                f.write(str(v + 1))


@pytest.mark.parametrize("child_shared_memory", ["true", "false"])
def test_a_lock_excludes_across_processes(tmp_path, monkeypatch, fresh_config,
                                          child_shared_memory):
    # read by the settings when the children start (fresh_config: not cached yet)
    monkeypatch.setenv("FIBER_SHARED_MEMORY", child_shared_memory)
    lock = fiber.Lock()
    counter = tmp_path / "n"
    counter.write_text("0")
    paths = fiber.Queue()
    procs = [fiber.Process(target=_count_under_lock, args=(lock, str(counter), 50, paths))
             for _ in range(2)]
    for p in procs:
        p.start()
    _count_under_lock(lock, str(counter), 50, paths)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    expected = "native" if child_shared_memory == "true" else "creator"
    assert sorted(paths.get(timeout=10) for _ in range(3)) == sorted(["native", expected,
                                                                      expected])
    assert counter.read_text() == "150"


def _waiter(cond, event, barrier, out):
    with cond:
        ok = cond.wait_for(event.is_set, 30)
    out.put(("cond", bool(ok)))
    out.put(("barrier", barrier.wait(30)))
    rlock_owner = synchronize._path(cond)
    out.put(("path", rlock_owner))


@pytest.mark.parametrize("child_shared_memory", ["true", "false"])
def test_condition_event_barrier_across_processes(monkeypatch, fresh_config,
                                                  child_shared_memory):
    monkeypatch.setenv("FIBER_SHARED_MEMORY", child_shared_memory)
    cond, event, barrier, out = fiber.Condition(), fiber.Event(), fiber.Barrier(3), fiber.Queue()
    procs = [fiber.Process(target=_waiter, args=(cond, event, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(0.5)
    with cond:
        event.set()
        cond.notify_all()
    own = barrier.wait(30)
    got = [out.get(timeout=60) for _ in range(6)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(v for k, v in got if k == "cond") == [True, True]
    assert sorted([own] + [v for k, v in got if k == "barrier"]) == [0, 1, 2]
    expected = "native" if child_shared_memory == "true" else "creator"
    assert [v for k, v in got if k == "path"] == [expected, expected]


def _make_and_hold(out):
    lock, sem = fiber.Lock(), fiber.Semaphore(5)
    out.put((lock, sem))
    time.sleep(600)


def test_killed_creator_native_holder():
    """A creator SIGKILLed: a holder on its host keeps the semaphores it opened, and
    the names are swept once the creator is gone."""
    out = fiber.Queue()
    creator = fiber.Process(target=_make_and_hold, args=(out,))
    creator.start()
    lock, sem = out.get(timeout=60)  # this process is on the creator's host: native
    assert synchronize._path(lock) == "native"
    assert any(n.startswith("sem.") for n in shm.state_names(creator.pid))
    creator_pid = creator.pid
    os.kill(creator_pid, signal.SIGKILL)
    creator.join(30)
    assert sem.acquire(timeout=1) is True
    sem.release()
    with lock:
        pass
    shm.sweep()
    assert shm.state_names(creator_pid) == []


def test_remote_holder_of_a_killed_creator_gets_a_clear_error(monkeypatch, fresh_config):
    monkeypatch.setenv("FIBER_SHARED_MEMORY", "false")
    out = fiber.Queue()
    creator = fiber.Process(target=_make_and_hold, args=(out,))
    creator.start()
    shm.set_host_token(None)  # this process uses them as another host would
    try:
        lock, sem = out.get(timeout=60)
        assert synchronize._path(lock) == "creator"
        assert lock.acquire() is True
        lock.release()
        os.kill(creator.pid, signal.SIGKILL)
        creator.join(30)
        t0 = time.monotonic()
        with pytest.raises(ConnectionLostError, match="created this shared object"):
            lock.acquire()
        assert time.monotonic() - t0 < 15
    finally:
        shm.set_host_token(shm._compute_token())


def test_no_names_left_after_exit(run_script):
    out = run_script("""
        import os
        import fiber

        def f(lock, event, cond, barrier):
            with lock:
                pass
            event.set()

        if __name__ == "__main__":
            objs = (fiber.Lock(), fiber.Event(), fiber.Condition(), fiber.Barrier(1))
            p = fiber.Process(target=f, args=objs)
            p.start()
            p.join()
            print(os.getpid(), objs[1].is_set())
    """)
    assert out.returncode == 0, out.stderr
    pid, flag = out.stdout.split()
    assert flag == "True"
    assert shm.state_names(int(pid)) == []
    assert out.stderr == ""
