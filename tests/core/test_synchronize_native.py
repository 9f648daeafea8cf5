"""fiber.synchronize's primitives on the local backend: multiprocessing's semantics and
reprs (the same calls on multiprocessing's objects and fiber's give the same results),
the native path of a child on the creator's host and the creator path of a child whose
``shared_memory`` setting is false, a creator killed under its holders, the names in
``/dev/shm`` (unlinked when collected and at exit, swept after a killed creator), the
multiprocessing documentation's Lock example, and the cost of an acquire+release."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import re
import threading
import time

import pytest

import fiber
from fiber import synchronize
from fiber.errors import ConnectionLostError
from fiber.runtime.shared import served
from fiber.wire import shm

pytestmark = pytest.mark.timeout(300)

MP = multiprocessing.get_context("spawn")


def _normal(text: str) -> str:
    """A repr without addresses, modules or process names (they differ by design)."""
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    return text.replace("multiprocessing.synchronize.", "").replace("fiber.synchronize.", "")


@pytest.fixture(autouse=True)
def _no_names_left():
    """Every name a test's primitives made is gone afterwards, except those of objects
    this process serves (kept until its exit, when they are unlinked: tested below)."""
    before = set(shm.state_names(os.getpid()))
    yield
    gc.collect()
    kept = set()
    # private read: the objects this process serves keep their names until exit; only the
    # server's list says which
    for obj in served._kept:
        for part in _semlocks(obj):
            if part._semlock.name:
                kept.add("sem." + part._semlock.name.lstrip("/"))
        buffer = getattr(obj, "_buffer", None)
        if buffer is not None:
            kept.add(buffer.name)
    left = set(shm.state_names(os.getpid())) - before - kept
    assert not left


# private read: the semaphores a primitive is made of (their names are what the fixture checks)
def _semlocks(obj):
    if isinstance(obj, synchronize.SemLock):
        return [obj]
    if isinstance(obj, synchronize.Condition):
        return list(obj._parts())
    if isinstance(obj, synchronize.Event):
        return [*obj._cond._parts(), obj._flag]
    if isinstance(obj, synchronize.Barrier):
        return list(obj._cond._parts())
    return []


# -- semantics: the same calls on multiprocessing's objects and fiber's ----------------
def _locks_scenario(m):
    out = []
    lock, rlock = m.Lock(), m.RLock()
    out += [repr(lock), lock.acquire(), repr(lock), lock.acquire(False),
            lock.acquire(True, 0.05), lock.acquire(timeout=0.05)]
    other = []
    t = threading.Thread(target=lambda: other.append((repr(lock), lock.acquire(False))))
    t.start()
    t.join()
    out += other
    lock.release()
    out.append(repr(lock))
    with pytest.raises(ValueError) as info:
        lock.release()
    out.append(str(info.value))
    out += [rlock.acquire(), rlock.acquire(), repr(rlock)]
    t = threading.Thread(target=lambda: other.append((repr(rlock), rlock.acquire(False))))
    t.start()
    t.join()
    out += other[1:]
    rlock.release()
    out.append(repr(rlock))
    rlock.release()
    out.append(repr(rlock))
    with pytest.raises(AssertionError) as info:
        rlock.release()
    out.append(str(info.value))
    with lock, rlock:
        out += [repr(lock), repr(rlock)]
    return out


def _semaphores_scenario(m):
    out = []
    sem, bsem = m.Semaphore(2), m.BoundedSemaphore(2)
    out += [repr(sem), sem.get_value(), sem.acquire(), sem.acquire(), sem.acquire(False),
            sem.acquire(timeout=0.05), sem.get_value(), repr(sem)]
    sem.release()
    sem.release()
    sem.release()
    out += [sem.get_value(), repr(bsem), bsem.acquire(), repr(bsem), bsem.get_value()]
    bsem.release()
    with pytest.raises(ValueError) as info:
        bsem.release()
    out += [str(info.value), repr(m.Semaphore(0)), m.Semaphore(0).acquire(timeout=0.01)]
    return out


def _condition_scenario(m):
    out = []
    cond = m.Condition()
    out.append(repr(cond))
    with cond:
        out += [repr(cond), cond.wait(0.05), cond.wait_for(lambda: 0, 0.05)]
    state = []

    def waiter():
        with cond:
            state.append(cond.wait_for(lambda: len(state) >= 1 and "go", 30))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with cond:
            waiting = repr(cond)
        if waiting.endswith(", 3)>"):
            break
        time.sleep(0.01)
    out.append(waiting)
    with cond:
        state.append("first")
        cond.notify()
    time.sleep(0.2)
    with cond:
        cond.notify_all()
    for t in threads:
        t.join(30)
    out += [sorted(map(str, state)), repr(cond)]
    with pytest.raises(AssertionError):
        cond.notify()
    with pytest.raises(AssertionError):
        cond.wait(0)
    lock_cond = m.Condition(m.Lock())
    with lock_cond:
        out += [repr(lock_cond), lock_cond.wait(0.01)]
    return out


def _event_scenario(m):
    ev = m.Event()
    out = [_normal(repr(ev)), ev.is_set(), ev.wait(0.05)]
    threading.Timer(0.1, ev.set).start()
    out += [ev.wait(30), ev.is_set(), _normal(repr(ev)), ev.wait()]
    ev.clear()
    out += [ev.is_set(), ev.wait(0)]
    return out


def _barrier_scenario(m):
    out = []
    actions = []
    bar = m.Barrier(3, action=lambda: actions.append("action"), timeout=30)
    out += [_normal(repr(bar)), bar.parties, bar.n_waiting, bar.broken]
    results = []
    threads = [threading.Thread(target=lambda: results.append(bar.wait())) for _ in range(2)]
    for t in threads:
        t.start()
    while bar.n_waiting < 2:
        time.sleep(0.01)
    out.append(_normal(repr(bar)))
    results.append(bar.wait())
    for t in threads:
        t.join(30)
    out += [sorted(results), actions, bar.n_waiting]
    with pytest.raises(threading.BrokenBarrierError):
        bar.wait(0.05)  # a party times out: the barrier breaks
    out += [bar.broken, _normal(repr(bar))]
    bar.reset()
    out.append(bar.broken)
    bar.abort()
    out.append(bar.broken)
    with pytest.raises(threading.BrokenBarrierError):
        bar.wait()
    bar.reset()
    failing = m.Barrier(1, action=lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    out.append(failing.broken)
    return out


@pytest.mark.parametrize("scenario", [_locks_scenario, _semaphores_scenario,
                                      _condition_scenario, _event_scenario,
                                      _barrier_scenario], ids=lambda f: f.__name__[1:-9])
def test_semantics_and_reprs_are_multiprocessings(scenario):
    expected = scenario(MP)
    got = scenario(fiber)
    assert got == expected


def test_classes_and_signatures_are_multiprocessings():
    for name in ("Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event",
                 "Barrier"):
        assert isinstance(getattr(fiber, name)(*((1,) if name == "Barrier" else ())),
                          getattr(synchronize, name))
    assert isinstance(fiber.get_context("spawn").Lock(), synchronize.Lock)
    assert isinstance(synchronize.Lock(ctx=fiber.get_context()), synchronize.SemLock)
    assert issubclass(synchronize.BoundedSemaphore, synchronize.Semaphore)
    assert issubclass(synchronize.Barrier, threading.Barrier)
    assert synchronize.SEM_VALUE_MAX == multiprocessing.synchronize.SEM_VALUE_MAX
    with pytest.raises(TypeError, match="Lock or an RLock"):
        synchronize.Condition(threading.Lock())


def test_a_primitive_pickled_back_to_its_creator_is_itself():
    lock, bar = fiber.Lock(), fiber.Barrier(2)
    assert pickle.loads(pickle.dumps(lock)) is lock
    assert pickle.loads(pickle.dumps(bar)) is bar


# -- across processes: native on one host, through the creator with shared_memory off ---
def _child(blob, objs, q, shared_memory):
    if not shared_memory:
        fiber.init(shared_memory=False)  # as FIBER_SHARED_MEMORY=false: before unpickling
        objs = pickle.loads(blob)
    lock, rlock, sem, bsem, cond, ev, go, bar = objs
    q.put([synchronize.shared_path(o) for o in objs])
    with cond:
        cond.notify()  # the parent waits in cond.wait()
    lock.acquire()
    rlock.acquire()
    rlock.acquire()
    q.put((repr(lock), repr(rlock)))
    assert go.wait(60)
    rlock.release()
    rlock.release()
    lock.release()
    try:
        bsem.release()
    except ValueError as exc:
        q.put(str(exc))
    sem.release()
    q.put(("barrier", bar.wait(60), bar.parties))
    ev.set()


@pytest.mark.parametrize("shared_memory", [True, False], ids=["native", "creator"])
def test_a_child_uses_the_primitives(shared_memory):
    objs = (fiber.Lock(), fiber.RLock(), fiber.Semaphore(0), fiber.BoundedSemaphore(1),
            fiber.Condition(), fiber.Event(), fiber.Event(), fiber.Barrier(2, timeout=60))
    lock, rlock, sem, bsem, cond, ev, go, bar = objs
    q = fiber.Queue()
    blob = pickle.dumps(objs)
    p = fiber.Process(target=_child, args=(blob, objs if shared_memory else None, q,
                                           shared_memory))
    with cond:
        p.start()
        assert cond.wait(120)  # notified by the child
    path = "native" if shared_memory else "creator"
    assert q.get(60) == [path] * len(objs)
    assert q.get(60) == (f"<Lock(owner={p.name})>", f"<RLock({p.name}, 2)>")
    assert not lock.acquire(False) and not rlock.acquire(timeout=0.05)
    owner = "SomeOtherProcess" if shared_memory else "SomeOtherThread"
    assert repr(rlock) == f"<RLock({owner}, nonzero)>"
    assert repr(lock) == f"<Lock(owner={owner})>"
    go.set()
    assert q.get(60) == "semaphore or lock released too many times"
    assert sem.acquire(timeout=60)
    index = bar.wait(60)
    kind, other, parties = q.get(60)
    assert kind == "barrier" and {index, other} == {0, 1} and parties == 2
    assert ev.wait(60)
    p.join(60)
    assert p.exitcode == 0
    assert lock.acquire(False) and rlock.acquire(False)
    lock.release()
    rlock.release()


# -- a killed creator -----------------------------------------------------------------
def _creator(q):
    lock, ev = fiber.Lock(), fiber.Event()
    q.put(pickle.dumps((lock, ev)))
    time.sleep(300)  # killed by the test


def _remote_holder(blob, q):
    fiber.init(shared_memory=False)
    lock, ev = pickle.loads(blob)
    with lock:
        q.put(synchronize.shared_path(lock))
    t0 = time.monotonic()
    try:
        ev.wait()  # blocked in the creator when it is killed
    except ConnectionLostError as exc:
        q.put(("wait", type(exc).__name__, str(exc), time.monotonic() - t0))
    t0 = time.monotonic()
    try:
        lock.acquire()
    except ConnectionLostError as exc:
        q.put(("acquire", type(exc).__name__, str(exc), time.monotonic() - t0))


def test_a_killed_creator():
    q = fiber.Queue()
    creator = fiber.Process(target=_creator, args=(q,))
    creator.start()
    blob = q.get(120)
    lock, ev = pickle.loads(blob)  # same host: native
    assert synchronize.shared_path(lock) == "native"
    holder = fiber.Process(target=_remote_holder, args=(blob, q))
    holder.start()
    assert q.get(120) == "creator"
    time.sleep(0.3)  # the holder is in ev.wait()
    names = shm.state_names(creator.pid)
    assert len(names) == 6  # the lock's semaphore; the event's condition (4) and flag
    creator.kill()
    creator.join(60)
    what, kind, message, waited = q.get(60)
    assert (what, kind) == ("wait", "ConnectionLostError") and waited < 10
    assert "created this shared object" in message
    what, kind, message, waited = q.get(60)
    assert (what, kind) == ("acquire", "ConnectionLostError") and waited < 10
    holder.join(60)
    # the native holder keeps working; the names are swept, the creator being gone
    assert shm.state_names(creator.pid) == names
    shm.sweep()
    assert shm.state_names(creator.pid) == []
    with lock:
        assert not lock.acquire(False)
    assert not ev.is_set()  # (not ev.set(): as in multiprocessing, notify would wait for
    #                          the sleeper killed in wait(), the creator's serving thread)
    with pytest.raises(FileNotFoundError, match="lock is gone: the process that created"):
        pickle.loads(blob)


# -- names -------------------------------------------------------------------------------
def test_names_are_unlinked_when_collected():
    pid = os.getpid()
    before = set(shm.state_names(pid))
    objs = [fiber.Lock(), fiber.RLock(), fiber.Semaphore(), fiber.BoundedSemaphore(),
            fiber.Condition(), fiber.Event(), fiber.Barrier(2)]
    made = set(shm.state_names(pid)) - before
    assert len([n for n in made if n.startswith("sem.")]) == 1 + 1 + 1 + 1 + 4 + 5 + 4
    assert len(made) == 17 + 1  # the barrier's counters
    del objs
    gc.collect()
    assert not made & set(shm.state_names(pid))


def test_names_are_unlinked_at_exit_after_the_children(run_script):
    result = run_script("""
        import os, pickle, fiber
        from fiber.wire import shm

        def use(objs, q, creator):
            lock, cond, bar = objs
            with lock, cond:
                q.put(len(shm.state_names(creator)))

        if __name__ == "__main__":
            objs = (fiber.Lock(), fiber.Condition(), fiber.Barrier(2))
            q = fiber.Queue()
            fiber.Process(target=use, args=(objs, q, os.getpid())).start()
            print(os.getpid(), q.get(60))
    """)
    assert result.returncode == 0, result.stderr
    pid, seen = map(int, result.stdout.split())
    assert seen == 1 + 4 + 4 + 1  # the child saw them all
    assert shm.state_names(pid) == []
    assert result.stderr == ""


def test_without_named_semaphores_the_creator_serves(run_script):
    """Fakes a host without named semaphores (``_multiprocessing.SemLock`` raising
    PermissionError, as on a read-only /dev/shm): the primitives are threading's, in
    the creator, and a child of the same host uses them through it."""
    result = run_script("""
        import _multiprocessing, fiber
        from fiber import synchronize

        class NoNamedSemaphores:
            SEM_VALUE_MAX = 2147483647
            def __init__(self, *args):
                raise PermissionError(13, "Permission denied", "/dev/shm")

        def use(objs, q):
            lock, rlock, sem, cond, ev = objs
            with rlock, rlock:
                r = repr(rlock)
            q.put(([synchronize.shared_path(o) for o in objs], r, lock.acquire(False),
                   sem.acquire(timeout=0.05)))
            with cond:
                cond.notify()
            ev.set()

        if __name__ == "__main__":
            _multiprocessing.SemLock = NoNamedSemaphores
            objs = (fiber.Lock(), fiber.RLock(), fiber.Semaphore(0), fiber.Condition(),
                    fiber.Event())
            lock, rlock, sem, cond, ev = objs
            lock.acquire()
            q = fiber.Queue()
            with cond:
                fiber.Process(target=use, args=(objs, q)).start()
                notified = cond.wait(60)
            print(q.get(60), notified, ev.wait(60), repr(lock), repr(sem))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == (
        "(['creator', 'creator', 'creator', 'creator', 'creator'], '<RLock(Process-1, 2)>', "
        "False, False) True True <Lock(owner=MainProcess)> <Semaphore(value=0)>")
    assert result.stderr.count("no named semaphores on this host") <= 1


# -- the documentation's example, and the cost -----------------------------------------


# The documentation's Lock example (20 runs) is tests/core/test_mp_doc_examples.py's;
# the costs are the benchmark suite's (python -m bench run --kinds shared).
