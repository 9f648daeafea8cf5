"""fiber.managers on the selected backend: SyncManager's types (adapted from the
multiprocessing documentation's examples), the same calls on a real
multiprocessing.Manager() giving the same results (acquire's arguments, Event,
Condition, Barrier, reprs), BaseManager.register of a user class,
AsyncManager's parallel method calls, Lock/Value/... without a manager,
remote exceptions with their traceback, and a dead manager failing calls promptly."""

from __future__ import annotations

import functools
import gc
import multiprocessing
import queue
import re
import threading
import time

import pytest

import fiber
from fiber.errors import ConnectionLostError
from fiber.managers import (
    AsyncManager,
    AsyncResult,
    BaseManager,
    Manager,
    RemoteTraceback,
    SyncManager,
)
from fiber.sharedctypes import Array as SharedArray
from fiber.sharedctypes import Value as SharedValue
from fiber.synchronize import Lock as SharedLock

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def _no_manager_left():
    """No test of this module leaves a process behind (fiber.Lock(), fiber.Value()...
    start none: they are shared memory, served by their creator)."""
    yield
    gc.collect()
    deadline = time.monotonic() + 30
    while [p for p in fiber.active_children() if p.is_alive()] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in fiber.active_children() if p.is_alive()]


@pytest.fixture(scope="module")
def manager():
    m = Manager()
    yield m
    m.shutdown()
    m.process.join(60)
    assert not m.process.is_alive()


def _run(target, *args, n=1):
    procs = [fiber.Process(target=target, args=args) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0] * n


# -- SyncManager: the documentation's examples ------------------------------------------
def _fill(d, ll):
    d[1] = "1"
    d["2"] = 2
    d[0.25] = None
    ll.reverse()


def test_dict_and_list_doc_example(manager):
    d = manager.dict()
    ll = manager.list(range(10))
    _run(_fill, d, ll)
    assert dict(d) == {1: "1", "2": 2, 0.25: None}
    assert list(ll) == list(reversed(range(10)))


def _queues(q, jq, results):
    results.append(q.get(timeout=60) * 2)
    while True:
        try:
            item = jq.get(timeout=1)
        except queue.Empty:
            break
        results.append(item)
        jq.task_done()


def test_queue_and_joinable_queue(manager):
    q, jq, results = manager.Queue(), manager.JoinableQueue(), manager.list()
    q.put(21)
    for i in range(3):
        jq.put(i)
    _run(_queues, q, jq, results)
    jq.join()  # every item was task_done() in the child
    assert sorted(results) == [0, 1, 2, 42]
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)


def _count_under_lock(lock, ns, n):
    for _ in range(n):
        with lock:
            value = ns.count
            ns.count = value + 1


def test_lock_and_namespace_across_processes(manager):
    lock, ns = manager.Lock(), manager.Namespace()
    ns.count = 0
    _run(_count_under_lock, lock, ns, 20, n=3)
    assert ns.count == 60


def test_rlock_semaphores(manager):
    rlock = manager.RLock()
    assert rlock.acquire() and rlock.acquire()
    rlock.release()
    rlock.release()
    sem = manager.Semaphore(2)
    assert sem.acquire(timeout=1) and sem.acquire(timeout=1)
    assert not sem.acquire(timeout=0.2)
    sem.release()
    sem.release()
    bounded = manager.BoundedSemaphore(1)
    bounded.acquire()
    bounded.release()
    with pytest.raises(ValueError):
        bounded.release()  # raised in the server, re-raised here


def _waiter(cond, event, state):
    with cond:
        cond.wait_for(lambda: state.get("go"), timeout=120)
    state["seen"] = True
    event.set()


def test_condition_and_event(manager):
    cond, event, state = manager.Condition(), manager.Event(), manager.dict()
    p = fiber.Process(target=_waiter, args=(cond, event, state))
    p.start()
    with cond:
        state["go"] = True
        cond.notify_all()
    assert event.wait(120)
    p.join(120)
    assert p.exitcode == 0 and state["seen"]


def _at_barrier(barrier, results):
    results.append(barrier.wait(120))


def test_barrier(manager):
    barrier, results = manager.Barrier(3), manager.list()
    procs = [fiber.Process(target=_at_barrier, args=(barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    results.append(barrier.wait(120))
    for p in procs:
        p.join(120)
    assert sorted(results) == [0, 1, 2]


def _scale(value, array):
    value.value *= 2
    for i in range(len(array)):
        array[i] = -array[i]


def test_value_and_array(manager):
    value = manager.Value("d", 1.5)
    array = manager.Array("i", range(5))
    _run(_scale, value, array)
    assert value.value == 3.0
    assert list(array) == [0, -1, -2, -3, -4]


def test_pool_in_the_manager(manager):
    pool = manager.Pool(2)
    assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]
    result = pool.apply_async(pow, (2, 10))
    assert result.get(60) == 1024
    pool.terminate()


def test_manager_as_context_manager():
    with SyncManager() as m:
        shared = m.list([1, 2])
        shared.append(3)
        assert list(shared) == [1, 2, 3]
        process = m.process
    process.join(60)
    assert not process.is_alive()


# -- the same calls on multiprocessing's manager give the same results --------------------
@pytest.fixture(scope="module")
def mp_manager():
    m = multiprocessing.Manager()
    yield m
    m.shutdown()


def _outcomes(calls):
    """What each call returns, or the type and text of what it raises."""
    result = []
    for call in calls:
        try:
            result.append(call())
        except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
            result.append((type(exc).__name__, str(exc)))
    return result


def _acquirer_calls(make):
    lock = make()
    return _outcomes([
        lambda: lock.acquire(timeout=0.1), lambda: lock.acquire(True, 0.1),
        lambda: lock.acquire(blocking=False), lambda: lock.acquire(False, 1),
        lock.release, lambda: lock.acquire(blocking=False), lock.release, lock.release])


@pytest.mark.parametrize("typeid, expected", [
    ("Lock", [True, False, False, ("ValueError", "can't specify a timeout for a "
                                                 "non-blocking call"),
              None, True, None, ("RuntimeError", "release unlocked lock")]),
    ("RLock", [True, True, True, ("ValueError", "can't specify a timeout for a "
                                                "non-blocking call"),
               None, True, None, None]),
    ("Semaphore", [True, False, False, ("ValueError", "can't specify timeout for "
                                                      "non-blocking acquire"),
                   None, True, None, None]),
    ("BoundedSemaphore", [True, False, False, ("ValueError", "can't specify timeout for "
                                                             "non-blocking acquire"),
                          None, True, None,
                          ("ValueError", "Semaphore released too many times")]),
])
def test_acquire_and_release_as_multiprocessing(manager, mp_manager, typeid, expected):
    assert _acquirer_calls(getattr(mp_manager, typeid)) == expected
    assert _acquirer_calls(getattr(manager, typeid)) == expected


def _synchronized_calls(value):
    return _outcomes([
        lambda: value.acquire(timeout=0.1), lambda: value.acquire(block=False),
        lambda: value.acquire(False, 1), lambda: value.acquire(True, 0.1), value.acquire,
        *[value.release] * 5])


def test_synchronized_value_acquire_as_multiprocessing(manager):
    """fiber's SyncManager.SynchronizedValue/Array take ``acquire``'s arguments as
    multiprocessing.Value's does (``block``, and a timeout only a blocking call uses)."""
    expected = [True] * 5 + [None] * 5
    assert _synchronized_calls(multiprocessing.Value("i", 1)) == expected
    assert _synchronized_calls(manager.SynchronizedValue("i", 1)) == expected
    assert _synchronized_calls(manager.SynchronizedArray("i", 2)) == expected


def _event_and_condition_calls(m):
    event, cond = m.Event(), m.Condition()

    def under(cond, call):
        with cond:
            return call()

    return _outcomes([
        lambda: event.wait(0.1), event.is_set, event.set, lambda: event.wait(0.1),
        lambda: event.wait(), event.clear, lambda: event.wait(0),
        lambda: under(cond, lambda: cond.wait(0.1)),
        lambda: under(cond, lambda: cond.wait_for(lambda: False, 0.1)),
        lambda: under(cond, lambda: cond.wait_for(lambda: 5, 0.1)),
        lambda: under(cond, lambda: cond.notify(2)),
        lambda: under(cond, cond.notify_all), cond.notify])


def test_event_and_condition_as_multiprocessing(manager, mp_manager):
    expected = [False, False, None, True, True, None, False, False, False, 5, None, None,
                ("RuntimeError", "cannot notify on un-acquired lock")]
    assert _event_and_condition_calls(mp_manager) == expected
    assert _event_and_condition_calls(manager) == expected


def _barrier_calls(m):
    ran = m.list()
    barrier = m.Barrier(1, action=functools.partial(ran.append, "action"), timeout=0.1)
    pair = m.Barrier(2, timeout=0.1)
    return _outcomes([
        lambda: barrier.wait(), lambda: barrier.wait(5), lambda: list(ran),
        lambda: (pair.parties, pair.n_waiting, pair.broken),
        pair.wait,  # the other party never comes: the barrier's timeout breaks it
        lambda: pair.broken, pair.reset, lambda: pair.broken, pair.abort,
        lambda: pair.wait(5), lambda: pair.broken])


def test_barrier_as_multiprocessing(manager, mp_manager):
    expected = [0, 0, ["action", "action"], (2, 0, False), ("BrokenBarrierError", ""),
                True, None, False, None, ("BrokenBarrierError", ""), True]
    assert _barrier_calls(mp_manager) == expected
    assert _barrier_calls(manager) == expected


def _mask(text):
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


def _reprs(m):
    objects = [m.Lock(), m.RLock(), m.Semaphore(2), m.BoundedSemaphore(2), m.Condition(),
               m.Event(), m.Barrier(2), m.Namespace(), m.list(), m.dict(), m.Value("i", 1),
               m.Array("i", [1]), m.Queue(), m.JoinableQueue()]
    return [(_mask(repr(obj)), _mask(str(obj))) for obj in objects]


def test_proxy_reprs_as_multiprocessing(manager, mp_manager):
    expected = _reprs(mp_manager)
    assert expected[0] == ("<AcquirerProxy object, typeid 'Lock' at 0x?>",
                           "<unlocked _thread.lock object at 0x?>")
    assert expected[4][0] == "<ConditionProxy object, typeid 'Condition' at 0x?>"
    assert _reprs(manager) == expected


def _wait_at(barrier, results):
    try:
        results.append(barrier.wait())
    except threading.BrokenBarrierError:
        results.append("broken")


def test_barrier_across_processes_action_abort_and_reset(manager):
    ran, results = manager.list(), manager.list()
    barrier = manager.Barrier(3, action=functools.partial(ran.append, 1))
    procs = [fiber.Process(target=_wait_at, args=(barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    index = barrier.wait(120)
    for p in procs:
        p.join(120)
    assert sorted([index, *results]) == [0, 1, 2] and list(ran) == [1]
    # a second generation, aborted while two waiters are in it
    del results[:]
    procs = [fiber.Process(target=_wait_at, args=(barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while barrier.n_waiting < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert barrier.n_waiting == 2
    barrier.abort()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert list(results) == ["broken", "broken"] and barrier.broken
    assert list(ran) == [1]  # the aborted generation ran no action
    barrier.reset()
    assert not barrier.broken and barrier.n_waiting == 0


def _notified(cond, ready, woke):
    with cond:
        ready.append(1)
        cond.wait(120)
        woke.append(1)


def test_condition_notify_n_and_all_across_processes(manager):
    cond, ready, woke = manager.Condition(), manager.list(), manager.list()
    procs = [fiber.Process(target=_notified, args=(cond, ready, woke)) for _ in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 120
    while True:
        with cond:  # both have said ready under the lock: both wait now
            if len(ready) == 2 or time.monotonic() > deadline:
                cond.notify(1)
                break
        time.sleep(0.05)
    while len(woke) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert len(woke) == 1, "notify(1) must wake one waiter, not both"
    with cond:
        cond.notify_all()
    for p in procs:
        p.join(120)
    assert len(woke) == 2 and [p.exitcode for p in procs] == [0, 0]


# -- BaseManager.register ----------------------------------------------------------------
class Counter:
    def __init__(self, start=0):
        self.value = start

    def add(self, n=1):
        self.value += n
        return self.value

    def get(self):
        return self.value

    def explode(self):
        raise KeyError("explode was called")


class CounterManager(BaseManager):
    pass


CounterManager.register("Counter", Counter)


def _add_to(counter, n):
    for _ in range(n):
        counter.add()


def test_register_user_class_and_share_its_proxy():
    with CounterManager() as m:
        counter = m.Counter(10)
        assert re.fullmatch(r"<AutoProxy\[Counter\] object, typeid 'Counter' at 0x[0-9a-f]+>",
                            repr(counter))
        assert counter.add(5) == 15
        _run(_add_to, counter, 5, n=2)
        assert counter.get() == 25


def test_remote_exception_carries_its_traceback():
    with CounterManager() as m:
        counter = m.Counter()
        with pytest.raises(KeyError, match="explode was called") as info:
            counter.explode()
        cause = info.value.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "in explode" in str(cause) and "Traceback" in str(cause)


def test_register_rejects_bad_input():
    class M(BaseManager):
        pass

    with pytest.raises(TypeError, match="not callable"):
        M.register("Thing", 42)
    with pytest.raises(ValueError, match="identifier"):
        M.register("not an identifier", Counter)


# -- AsyncManager -----------------------------------------------------------------------
class Env:
    """A tiny environment whose step takes 0.1 s (a simulator's cost)."""

    def __init__(self, delay=0.1):
        self.delay = delay
        self.t = 0

    def reset(self):
        self.t = 0
        return self.t

    def step(self, action):
        time.sleep(self.delay)
        self.t += 1
        return self.t, float(action), self.t >= 100, {}

    def fail(self):
        raise RuntimeError("env failed")


class MyManager(AsyncManager):
    pass


MyManager.register("Env", Env)


def test_async_manager_announced_pattern_steps_in_parallel():
    manager = MyManager()
    manager.start()
    try:
        envs = [manager.Env() for _ in range(10)]
        handles = [env.reset() for env in envs]
        assert all(isinstance(h, AsyncResult) for h in handles)
        assert [h.get() for h in handles] == [0] * 10
        t0 = time.monotonic()
        handles = [env.step(1) for env in envs]
        issued = time.monotonic() - t0
        results = [h.get() for h in handles]
        elapsed = time.monotonic() - t0
        assert results == [(1, 1.0, False, {})] * 10
        assert issued < 0.1, "calls must return at once"
        assert elapsed < 0.6, f"10 steps of 0.1 s took {elapsed:.2f}s: not in parallel"
    finally:
        manager.shutdown()


def test_async_manager_hundred_steps_and_ordering():
    manager = MyManager()
    manager.start()
    try:
        envs = [manager.Env(0.0) for _ in range(10)]
        obs = [h.get() for h in [env.reset() for env in envs]]
        assert obs == [0] * 10
        for _ in range(100):
            handles = [env.step(0) for env in envs]
            results = [h.get() for h in handles]
        assert [r[0] for r in results] == [100] * 10 and all(r[2] for r in results)
        # several calls on one object before any get(): answered in order
        first, second = envs[0].reset(), envs[0].step(3)
        assert second.get(60)[:2] == (1, 3.0) and first.get() == 0
        failing = envs[1].fail()
        with pytest.raises(RuntimeError, match="env failed") as info:
            failing.get(60)
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert str(envs[2]).startswith("<") and "Env" in str(envs[2])
        slow = manager.Env(5.0).step(0)
        with pytest.raises(fiber.TimeoutError):
            slow.get(timeout=0.2)
        assert not slow.ready()
    finally:
        manager.shutdown()


def test_async_results_dropped_or_outliving_their_proxy():
    manager = MyManager()
    manager.start()
    try:
        env = manager.Env(0.0)
        env.step(0)  # its handle is dropped unread: the reply is discarded in turn
        assert env.step(7).get(60) == (2, 7.0, False, {})
        pending = manager.Env(0.3).step(5)  # the proxy is dropped at once
        gc.collect()
        assert pending.get(60) == (1, 5.0, False, {})
    finally:
        manager.shutdown()


# -- implicit primitives ------------------------------------------------------------------
def _increment(value, array, lock, n):
    for _ in range(n):
        with value.get_lock():
            value.value += 1
        with lock:
            array[0] = array[0] + 1


def test_implicit_value_array_lock_across_processes():
    value = SharedValue("i", 0)
    array = SharedArray("l", [0, 7])
    lock = SharedLock()
    _run(_increment, value, array, lock, 25, n=3)
    assert value.value == 75
    assert array[:] == [75, 7] and len(array) == 2
    with value:  # a synchronized value is its own lock too
        value.value = -1
    assert value.value == -1


def test_implicit_primitives_exist_and_work():
    from fiber import synchronize

    event = synchronize.Event()
    threading.Timer(0.2, event.set).start()
    assert event.wait(30)
    sem = synchronize.BoundedSemaphore(2)
    assert sem.acquire() and sem.acquire() and not sem.acquire(timeout=0.1)
    rlock = synchronize.RLock()
    with rlock, rlock:
        pass
    cond = synchronize.Condition(synchronize.Lock())
    with cond:
        assert not cond.wait(0.1)
    assert synchronize.Barrier(1).wait(10) == 0
    assert synchronize.Semaphore(0).acquire(timeout=0.1) is False


def test_value_rejects_bad_input_as_multiprocessing():
    import multiprocessing.sharedctypes as mp
    import re

    from fiber import sharedctypes

    for call in (lambda m: m.Value("z", 1), lambda m: m.Value("i", 1, lock="yes"),
                 lambda m: m.Array(list, 3)):
        with pytest.raises(Exception) as theirs:
            call(mp)
        with pytest.raises(type(theirs.value), match=re.escape(str(theirs.value))):
            call(sharedctypes)


def test_round_trip_cost_is_measured(manager):
    """A manager operation is one round trip; record its cost (the docs quote it)."""
    value = manager.Value("i", 0)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        value.value  # noqa: B018 - the round trip is the point
    per_op = (time.perf_counter() - t0) / n
    print(f"manager round trip: {per_op * 1e3:.3f} ms")
    assert per_op < 0.05


# -- failures -----------------------------------------------------------------------------
def test_dead_manager_fails_every_call_promptly():
    manager = MyManager()
    manager.start()
    sync = CounterManager()
    sync.start()
    try:
        env = manager.Env(0.0)
        counter = sync.Counter()
        assert env.reset().get(60) == 0 and counter.add() == 1
        blocked = manager.Env(60.0).step(0)  # in flight when the server dies
        manager.process.kill()
        sync.process.kill()
        manager.process.join(60)
        sync.process.join(60)
        t0 = time.monotonic()
        with pytest.raises(ConnectionLostError, match="manager at .* gone|cannot reach"):
            blocked.get(60)
        with pytest.raises(ConnectionLostError):
            env.step(0).get(60)
        with pytest.raises(ConnectionLostError):
            counter.add()
        with pytest.raises(ConnectionLostError, match="cannot reach the manager"):
            sync.Counter()
        assert time.monotonic() - t0 < 10
    finally:
        t0 = time.monotonic()
        manager.shutdown()
        sync.shutdown()
        assert time.monotonic() - t0 < 30
    assert not manager.process.is_alive() and not sync.process.is_alive()
