"""The reply path of ``apply_async(...).get()`` (issue #29, the third pass;
bench/results/floor/ANALYSIS.md): a caller that reads its worker's connection itself
handles the ``RESULTS`` frame it reads on its own thread, without the hub's dispatch;
a parked connection read again directly takes no listener lock; a batch that nothing
can recall is flagged so that the worker skips its recall guard. The guarantees next
to them stay: a worker killed mid-task has its task run again, results reach every
caller, recalls still take back only unstarted tasks.

Layers faked, as each test says: the hub's dispatch of the pool's frames is wrapped to
record which thread dispatched what (the frames still go through it); the listener's
lock is wrapped to count its uses; the pending table is driven with fake lines (as
tests/core/test_pool_scheduler.py does); the Giver gets a fake client (it only opens a
context). The pools, workers, hubs, sockets and kills are real.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import fiber
from fiber.errors import FiberThreadError
from fiber.runtime.pool import giver as pool_giver
from fiber.runtime.pool.giver import Giver
from fiber.runtime.pool.scheduler import Scheduler
from fiber.wire import serialization, transport
from fiber.wire.protocol import CHANNEL, BatchFlag, PoolOp
from fiber.wire.stream import server
from fiber.wire.stream.client import StreamClient


def _record_dispatches(pool):
    """Wrap the stream listener's dispatch (a fake layer around the real one): each
    frame of ``pool``'s channel it dispatches is recorded as (thread, op). Returns the
    records and what puts the real dispatch back."""
    listener = pool._worker_set._hub._stream
    prefix = b"M" + CHANNEL.pack(pool._cid)
    seen: list = []
    real = listener._dispatch

    def dispatch(request, body, stream):
        if body[:9] == prefix:
            seen.append((threading.current_thread(), bytes(body[9:10])))
        return real(request, body, stream)

    def restore() -> None:
        listener._dispatch = real

    listener._dispatch = dispatch
    return seen, restore


def pid_after(path: str, seconds: float) -> int:
    """Write this process's pid to ``path`` (appending), then sleep."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    time.sleep(seconds)
    return os.getpid()


def raise_value_error(x):
    raise ValueError(f"bad {x}")


def test_a_result_read_directly_does_not_pass_the_hubs_dispatch(tmp_path):
    """Real pool and worker; the hub's dispatch is wrapped to record what it
    dispatches (fake layer). A loop of ``apply`` reads each result on the caller's
    thread and no RESULTS frame of it goes through the hub's dispatch there (before,
    every one did: the direct reader dispatched through the hub, channel and
    handoff); the results are right, callbacks run, a failure raises the task's
    exception with its remote traceback, the counts are kept. A worker killed while the caller reads its
    connection still has its call run again on the replacement, and the calls after
    take the reply path too."""
    main = threading.current_thread()
    log = tmp_path / "starts"
    with fiber.Pool(1) as pool:
        pool.apply(abs, (-1,))  # the worker is up
        seen, restore = _record_dispatches(pool)
        try:
            assert [pool.apply(abs, (-i,)) for i in range(60)] == list(range(60))
            on_main = [op for thread, op in seen if thread is main and op == PoolOp.RESULTS]
            assert on_main == []
            channel = pool._worker_set._hub.channel(pool._cid)
            assert channel.direct_results >= 1
            # what the results deliver is as before: callbacks, the task's exception
            # with its remote traceback, the counts
            got: list = []
            assert pool.apply_async(square, (7,), callback=got.append).get(30) == 49
            errors: list = []
            failing = pool.apply_async(raise_value_error, (3,), error_callback=errors.append)
            try:
                failing.get(timeout=30)
            except ValueError as exc:
                assert str(exc) == "bad 3"
                assert "raise_value_error" in str(exc.__cause__)
            else:
                raise AssertionError("no error")
            assert got == [49] and len(errors) == 1
            assert pool.stats().failed == 1
            taken = channel.direct_results

            result = pool.apply_async(pid_after, (str(log), 1.0))
            deadline = time.monotonic() + 30
            while not (log.exists() and log.read_text()):
                assert time.monotonic() < deadline, "the call never started"
                time.sleep(0.01)
            killed = int(log.read_text().split()[0])
            os.kill(killed, signal.SIGKILL)
            started = time.monotonic()
            pid = result.get(timeout=60)
            assert time.monotonic() - started < 30
            assert pid != killed
            assert [int(x) for x in log.read_text().split()] == [killed, pid]
            assert pool.stats().lost == 1

            assert [pool.apply(abs, (-i,)) for i in range(20)] == list(range(20))
            assert channel.direct_results > taken
            on_main = [op for thread, op in seen if thread is main and op == PoolOp.RESULTS]
            assert on_main == []
        finally:
            restore()


def square(x):
    return x * x


class _Line:
    """A worker's standing request (fake): records the one answer."""

    def __init__(self) -> None:
        self.peer = 1000
        self.answer: bytes | None = None

    def reply(self, data: bytes) -> bool:
        assert self.answer is None
        self.answer = data
        return True

    def flags(self) -> int:
        assert self.answer is not None and self.answer[:1] == PoolOp.TASKS
        return int(serialization.loads(memoryview(self.answer)[1:])[0])


class _Sink:
    def _set(self, start, count, ok, value) -> None:
        pass


def test_a_batch_nothing_can_recall_is_flagged_kept():
    """Fake lines. A call sent to a worker holding nothing runs at once as its task in
    progress, which is never recalled: its batch says ``KEPT`` (with the give line's
    opening, the first time). The call taken in advance on the other line can be
    recalled: no ``KEPT``. A map's batch of several tasks: none either. (A suspect
    batch keeps its plain ``True``: tests/core/test_pool_scheduler.py.)"""
    s = Scheduler(1, 3)
    (w,) = s.new_workers(1)
    lines = {line: _Line() for line in (0, 1)}
    for line, request in lines.items():
        s.ready(w, line, request)
    s.submit_call(square, (3,), None, _Sink())
    assert lines[0].flags() == BatchFlag.KEPT | BatchFlag.OPEN_GIVE
    assert w.give_open
    s.submit_call(square, (4,), None, _Sink())
    assert lines[1].flags() & BatchFlag.KEPT == 0
    assert s.unstarted(w)[1]  # (the one the table may recall)

    s2 = Scheduler(1, 3)
    (w2,) = s2.new_workers(1)
    lines2 = {line: _Line() for line in (0, 1)}
    for line, request in lines2.items():
        s2.ready(w2, line, request)
    s2.submit_chunks(square, list(range(40)), 1, 1, _Sink())
    assert len(w2.held[0]) > 1
    assert lines2[0].flags() & BatchFlag.KEPT == 0


def test_a_kept_batch_runs_without_the_recall_guard_unless_the_giver_died():
    """Fake client (the Giver only opens a context on it here). A ``KEPT`` batch runs
    with no recall guard (no lock per task); any other batch with the Giver; and a
    KEPT batch too once the Giver's thread has died, so its tasks fail with the cause
    as before."""

    class _Client:
        def context(self):
            return object()

    guard = pool_giver.guard
    giver = Giver(_Client(), cid=5, worker_id=9)
    assert guard(BatchFlag.KEPT | BatchFlag.OPEN_GIVE, giver) is None
    assert guard(BatchFlag.KEPT | BatchFlag.SUSPECT, giver) is None
    assert guard(0, giver) is giver
    assert guard(BatchFlag.OPEN_GIVE, giver) is giver
    giver.error = FiberThreadError("fiber-pool-give died", "fiber-pool-give")
    assert guard(BatchFlag.KEPT, giver) is giver


class _CountingLock:
    """Wraps the listener's lock (a fake layer), counting the times the thread that
    made it takes it (the selector thread takes it too, when woken: not counted)."""

    def __init__(self, lock) -> None:
        self.lock = lock
        self.taken = 0
        self.thread = threading.get_ident()

    def __enter__(self):
        if threading.get_ident() == self.thread:
            self.taken += 1
        return self.lock.__enter__()

    def __exit__(self, *exc):
        return self.lock.__exit__(*exc)


class _Parking:
    """A channel that parks every request (a worker's line waiting for a batch)."""

    def __init__(self) -> None:
        self.parked: list = []

    def handle(self, request, payload) -> None:
        self.parked.append(request)

    def peer_gone(self, peer: int) -> None:
        pass


def test_a_parked_connection_is_read_again_without_the_listeners_lock(monkeypatch):
    """Real hub and client; the listener's lock is wrapped to count its uses (a fake
    layer), and the time a connection stays parked is made long (60 s) so that the
    selector thread does not take it back between the reads. The first direct read
    takes the connection out of the selector (the lock, twice); the next ones find it
    parked and leave it so without the lock (before: once each). Once the parking time
    is short again, the selector thread takes it back and dispatches a frame no caller
    reads."""
    monkeypatch.setattr(server, "_PARK", 60.0)
    hub = transport.Hub("127.0.0.1")
    channel = _Parking()
    cid = hub.add_channel(channel, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        listener = hub._stream
        ctx = client.context()
        ctx.send(cid, b"first")
        deadline = time.monotonic() + 10
        while not channel.parked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        request = channel.parked.pop()
        counting = _CountingLock(listener._lock)
        listener._lock = counting
        ctx.send(cid, b"next")
        assert request.read_until(lambda: bool(channel.parked), 10)
        first = counting.taken
        assert first >= 1
        request = channel.parked.pop()
        for i in range(5):
            ctx.send(cid, b"again%d" % i)
            assert request.read_until(lambda: bool(channel.parked), 10)
            request = channel.parked.pop()
        assert counting.taken == first
        monkeypatch.setattr(server, "_PARK", 0.002)
        listener._wake()
        ctx.send(cid, b"unread")
        deadline = time.monotonic() + 10
        while not channel.parked:
            assert time.monotonic() < deadline, "the selector never took it back"
            time.sleep(0.01)
    finally:
        client.close()
        hub.close()
