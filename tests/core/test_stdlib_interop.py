"""fiber's objects handed to processes of the *standard library*
(``multiprocessing.get_context(m).Process`` with spawn, forkserver and fork), as
multiprocessing's own objects are handed to them: as Process arguments.

Every test starts real standard-library children of the pytest process (the fiber
parent) and checks both directions where they make sense: the child puts or sends and
the parent gets, the parent puts and the child gets. A spawned or forkserver child gets
the run's secret in the pickle multiprocessing writes for it; a forked child reaches
its parent's queues and pipes by the parent's stream wire (nng cannot be used after a
fork) and holds an inherited pipe end as multiprocessing's forked child holds its
descriptor. What cannot work raises at once (ForkedProcessError), checked below.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import threading
import time

import pytest

import fiber
from fiber import context as fiber_context
from fiber.errors import ForkedProcessError
from fiber.wire import auth

METHODS = ["spawn", "forkserver", "fork"]
QUEUES = ["Queue", "SimpleQueue", "JoinableQueue"]


def _start(method, target, *args):
    proc = multiprocessing.get_context(method).Process(target=target, args=args)
    proc.start()
    return proc


def _finish(proc, timeout=60):
    proc.join(timeout)
    assert proc.exitcode == 0, f"the standard-library child exited with {proc.exitcode}"


# -- children (module level: spawn and forkserver children import them) ---------------
def _queue_child(inbox, outbox, joinable):
    outbox.put(("from-child", multiprocessing.current_process().name))
    item = inbox.get(timeout=30)
    if joinable:
        inbox.task_done()
    outbox.put(("echo", item))


def _pipe_child(conn):
    conn.send(("hello", multiprocessing.current_process().name))
    value = conn.recv()
    conn.send_bytes(b"x" * value)
    conn.close()


def _pipe_child_keeps(conn, done):
    conn.send("sent")
    done.wait(30)  # holds its end, unused, until the parent has checked


def _count_child(lock, counter, n):
    for _ in range(n):
        with lock:
            value = counter.value
            time.sleep(0)
            counter.value = value + 1


def _primitives_child(barrier, event, sem, bsem, rlock, cond, flag, value, array, report):
    barrier.wait(30)                        # meets the parent
    event.set()
    sem.release()
    bsem.acquire(timeout=30)
    with rlock:
        with rlock:                         # reentrant in this process
            value.value += 1.5
    array[:] = [x * 10 for x in array[:]]
    with cond:
        flag.value = 1
        cond.notify_all()
    report.put("done")


def _forked_child_errors(report):
    try:
        fiber.Queue()
    except ForkedProcessError as exc:
        report.put(("create", type(exc).__name__, str(exc)))
    else:
        report.put(("create", "no error", ""))


def _forked_child_uses_foreign(foreign, report):
    try:
        foreign.put("lost?")
    except ForkedProcessError as exc:
        report.put(("foreign", type(exc).__name__, str(exc)))
    else:
        report.put(("foreign", "no error", ""))


def _fiber_owner(report, stop):
    own = fiber.Queue()
    report.put(own)
    stop.wait(60)


# -- tests ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", QUEUES)
def test_queue_both_directions(method, kind):
    make = getattr(fiber, kind)
    inbox, outbox = make(), make()
    inbox.put("from-parent")                   # the parent puts, the child gets
    proc = _start(method, _queue_child, inbox, outbox, kind == "JoinableQueue")
    first = outbox.get(timeout=30)              # the child puts, the parent gets
    assert first[0] == "from-child" and first[1] == proc.name
    assert outbox.get(timeout=30) == ("echo", "from-parent")
    if kind == "JoinableQueue":
        inbox.join()                            # the child's task_done reached the owner
    _finish(proc)
    assert outbox.empty() and inbox.empty()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("duplex", [True, False])
def test_pipe_both_directions_and_eof(method, duplex):
    if duplex:
        mine, theirs = fiber.Pipe()
        proc = _start(method, _pipe_child, theirs)
    else:  # two one-way pipes: the child writes one and reads the other
        reader, writer = fiber.Pipe(duplex=False)
        child_reader, parent_writer = fiber.Pipe(duplex=False)
        proc = _start(method, _pipe_child_oneway, writer, child_reader)
        writer.close()
        child_reader.close()
        assert reader.recv()[0] == "hello"
        parent_writer.send(3)
        assert reader.recv_bytes() == b"xxx"
        _finish(proc)
        with pytest.raises(EOFError):           # the child's end closed: nothing is lost
            reader.recv()
        return
    theirs.close()                              # the usual idiom: only the child holds it
    assert mine.recv() == ("hello", proc.name)
    mine.send(5)
    assert mine.recv_bytes() == b"xxxxx"
    _finish(proc)
    assert mine.poll(30)
    with pytest.raises(EOFError):
        mine.recv()


def _pipe_child_oneway(writer, reader):
    writer.send(("hello", multiprocessing.current_process().name))
    writer.send_bytes(b"x" * reader.recv())
    writer.close()


@pytest.mark.parametrize("method", METHODS)
def test_inherited_pipe_end_stays_open_until_the_child_exits(method):
    """The child never closes its end: the parent's reader sees EOF only once the
    child has exited (a forked child holds it unused; a spawned one registered it)."""
    mine, theirs = fiber.Pipe()
    done = fiber.Event()
    proc = _start(method, _pipe_child_keeps, theirs, done)
    theirs.close()
    assert mine.recv() == "sent"
    assert not mine.poll(0.5)                   # the child still holds its end: no EOF
    done.set()
    _finish(proc)
    assert mine.poll(30)
    with pytest.raises(EOFError):
        mine.recv()


@pytest.mark.parametrize("method", METHODS)
def test_lock_contended_between_fiber_parent_and_stdlib_child(method):
    lock = fiber.Lock()
    counter = fiber.RawValue("i", 0)            # no lock of its own: only `lock` protects it
    n = 2000
    proc = _start(method, _count_child, lock, counter, n)
    _count_child(lock, counter, n)
    _finish(proc)
    assert counter.value == 2 * n


def _sum_child(values, array, total):
    total.value = values.value + sum(array)


@pytest.mark.parametrize("method", METHODS)
def test_shared_ctypes_after_the_standard_library_made_its_own(method):
    """Once a process has made a multiprocessing.sharedctypes object, multiprocessing's
    pickler reduces every object of that ctypes type with its own reducer (it registers
    it globally), fiber's too: they must still reach the child as shared memory."""
    import multiprocessing.sharedctypes as stdlib_sharedctypes

    stdlib_sharedctypes.RawValue("i", 1)
    stdlib_sharedctypes.RawArray("d", 2)
    values, array, total = fiber.RawValue("i", 5), fiber.RawArray("d", [1.5, 2.5]), \
        fiber.RawValue("d", 0.0)
    proc = _start(method, _sum_child, values, array, total)
    _finish(proc)
    assert total.value == 9.0  # written by the child into the parent's memory


@pytest.mark.parametrize("method", METHODS)
def test_synchronization_primitives_and_shared_ctypes(method):
    barrier = fiber.Barrier(2)
    event, sem, bsem = fiber.Event(), fiber.Semaphore(0), fiber.BoundedSemaphore(1)
    rlock, cond, flag = fiber.RLock(), fiber.Condition(), fiber.Value("i", 0)
    value, array, report = fiber.Value("d", 1.0), fiber.Array("i", [1, 2, 3]), fiber.Queue()
    bsem.acquire()                               # the child waits until the parent releases
    proc = _start(method, _primitives_child, barrier, event, sem, bsem, rlock, cond, flag,
                  value, array, report)
    barrier.wait(30)
    assert event.wait(30)
    assert sem.acquire(timeout=30)
    bsem.release()
    with cond:
        assert cond.wait_for(lambda: flag.value == 1, 30)
    assert report.get(timeout=30) == "done"
    _finish(proc)
    assert value.value == 2.5
    assert array[:] == [10, 20, 30]
    bsem.release()                               # back to its bound (the child took it)
    with pytest.raises(ValueError):              # a BoundedSemaphore stays bounded
        bsem.release()


def test_forked_child_cannot_create_wire_objects_and_says_so():
    report = fiber.Queue()
    proc = _start("fork", _forked_child_errors, report)
    kind, name, message = report.get(timeout=30)
    _finish(proc)
    assert (kind, name) == ("create", "ForkedProcessError")
    assert "spawn" in message and "forkserver" in message


def test_forked_child_cannot_reach_a_queue_of_another_process_and_says_so():
    """A queue owned by a fiber job (not the forked child's parent) cannot be reached
    after a fork: the put raises at once instead of being lost."""
    report, stop = fiber.Queue(), fiber.Event()
    owner = fiber.Process(target=_fiber_owner, args=(report, stop))
    owner.start()
    try:
        foreign = report.get(timeout=60)
        foreign.put("reachable from the parent")   # the parent itself uses nng to it
        assert foreign.get(timeout=30) == "reachable from the parent"
        proc = _start("fork", _forked_child_uses_foreign, foreign, report)
        kind, name, message = report.get(timeout=30)
        _finish(proc)
        assert (kind, name) == ("foreign", "ForkedProcessError")
        assert "not its parent" in message
        assert foreign.empty()
    finally:
        stop.set()
        owner.join(30)
    assert owner.exitcode == 0


def test_secret_travels_only_in_a_stdlib_spawn_pickle():
    """fiber objects pickled outside a standard-library Popen (into a queue, a fiber
    Process's payload, anywhere) do not carry the run's secret."""
    q = fiber.Queue()
    a, b = fiber.Pipe()
    secret = auth.get_authkey()
    assert secret not in pickle.dumps(q)
    assert secret not in pickle.dumps(b)

    from fiber.runtime import popen_payload
    from fiber.wire import serialization

    with popen_payload.pickling("p"):
        payload = serialization.dumps_code((q, b), popen_payload.reducer_for)
    assert secret not in payload


def test_nothing_left_behind():
    """After the tests above: no standard-library child alive, and no thread waiting
    for a forked child's pipe ends."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        holds = [t for t in threading.enumerate() if t.name == "fiber-fork-holds"]
        if not multiprocessing.active_children() and not holds:
            break
        time.sleep(0.1)
    assert multiprocessing.active_children() == []
    assert [t for t in threading.enumerate() if t.name == "fiber-fork-holds"] == []


def test_queue_empty_raises_at_once_in_stdlib_child_too():
    q = fiber.Queue()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.1)


def test_os_fork_child_exiting_normally_uses_and_leaves_the_parents_objects(run_script):
    """A child of a plain ``os.fork()`` that ends through ``sys.exit`` (so Python's exit
    handlers run in it) delivers what it put and sent, and runs none of its parent's
    exit work (which would end the parent's children or close its connections)."""
    result = run_script(
        """
        import os, sys
        import fiber

        def work(q):
            q.put("job")

        if __name__ == "__main__":
            q = fiber.Queue()
            a, b = fiber.Pipe()
            job = fiber.Process(target=work, args=(q,))
            job.start(); job.join()
            assert q.get(timeout=30) == "job"
            pid = os.fork()
            if pid == 0:
                q.put("forked")
                b.send("sent")
                b.close()
                sys.exit(0)
            b.close()
            _, status = os.waitpid(pid, 0)
            print("status", os.waitstatus_to_exitcode(status))
            print(q.get(timeout=30), a.recv())
            try:
                a.recv()
            except EOFError:
                print("EOF")
            late = fiber.Process(target=work, args=(q,))   # the parent still works
            late.start(); late.join()
            print(q.get(timeout=30), late.exitcode)
        """, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["status 0", "forked sent", "EOF", "job 0"]
    assert "Traceback" not in result.stderr and "panic" not in result.stderr


class _OnlyThroughInheritance:
    """An object that, like multiprocessing's locks, may only go to a starting child."""

    def __reduce__(self):
        fiber_context.assert_spawning(self)
        return (_OnlyThroughInheritance, ())


def _takes_inherited(obj, report):
    report.put(type(obj).__name__)


def test_assert_spawning_passes_in_a_starting_process_only():
    import multiprocessing.context as mp_context

    assert fiber_context.assert_spawning is mp_context.assert_spawning
    obj = _OnlyThroughInheritance()
    with pytest.raises(RuntimeError, match="through inheritance"):
        fiber_context.assert_spawning(obj)
    report = fiber.Queue()
    proc = fiber.Process(target=_takes_inherited, args=(obj, report))   # a job's payload
    proc.start()
    assert report.get(timeout=60) == "_OnlyThroughInheritance"
    proc.join(60)
    assert proc.exitcode == 0
    with pytest.raises(TypeError, match="through inheritance"):            # not in a queue
        report.put(obj)
    assert mp_context.get_spawning_popen() is None                       # left as it was


def _locks_child(lock):
    pass


def test_multiprocessing_objects_in_a_job_payload_fail_at_start_with_a_clear_error():
    """Standard locks and pipes hold resources of this host: refused at start, with a
    message naming fiber's counterpart; a standard Queue can be read by a job but not
    written (its put raises in the job)."""
    with pytest.raises(TypeError, match="fiber"):
        fiber.Process(target=_locks_child, args=(multiprocessing.Lock(),)).start()
    reader, writer = multiprocessing.Pipe()
    with pytest.raises(TypeError, match="Pipe"):
        fiber.Process(target=_locks_child, args=(writer,)).start()
    assert fiber.active_children() == []


def _std_queue_child(std_queue, report):
    report.put(std_queue.get(timeout=30))
    try:
        std_queue.put("lost?")
    except ValueError as exc:
        report.put(str(exc))


def test_multiprocessing_queue_read_by_a_job_and_put_refused():
    std_queue, report = multiprocessing.Queue(), fiber.Queue()
    std_queue.put("from the standard queue")
    proc = fiber.Process(target=_std_queue_child, args=(std_queue, report))
    proc.start()
    assert report.get(timeout=60) == "from the standard queue"
    assert "can get items from it but not put" in report.get(timeout=60)
    proc.join(60)
    assert proc.exitcode == 0
    std_queue.close()
    std_queue.join_thread()


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_shared_objects_through_their_creator_in_a_stdlib_child(run_script, method):
    """With the ``shared_memory`` setting off in the child, primitives and shared ctypes
    objects are proxies of the creator's: the child needs the run's secret for them,
    which the pickle of a standard-library spawn brings."""
    result = run_script(
        f"""
        import multiprocessing
        import fiber
        from fiber import synchronize

        def child(lock, value, array, q):
            q.put(synchronize.shared_path(lock))
            with lock:
                value.value += 1
            array[1] = 7

        if __name__ == "__main__":
            lock, value, array, q = fiber.Lock(), fiber.Value("i", 1), fiber.Array("i", 3), fiber.Queue()
            ctx = multiprocessing.get_context({method!r})
            p = ctx.Process(target=child, args=(lock, value, array, q))
            p.start(); p.join(60)
            print(p.exitcode, q.get(timeout=10), value.value, array[:])
        """, env={"FIBER_SHARED_MEMORY": "false"}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0 creator 2 [0, 7, 0]", result.stderr
