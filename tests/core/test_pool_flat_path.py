"""The flat per-task path of ``apply_async(...).get()`` (issue #29): a call submitted
while a worker is idle goes to that worker from the caller's thread without passing the
queue, and a pool worker's wire client reads its replies without a Condition when it is
the only thread waiting; the guarantees stay (a killed worker's task runs again, replies
of several waiting threads reach each one).

The first two tests fake a layer, and say so: the pending table is driven with fake
lines (as tests/core/test_pool_scheduler.py does), and the client's Condition is wrapped
to count its uses. The others run real pools and a real hub on the local backend.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time

import fiber
from fiber.runtime.pool.scheduler import Scheduler
from fiber.wire import serialization, transport
from fiber.wire.protocol import BatchFlag, PoolOp, TaskKind
from fiber.wire.stream.client import StreamClient


def square(x):
    return x * x


class _Line:
    """A worker's standing request (fake): records the one answer."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.answer: bytes | None = None

    def reply(self, data: bytes) -> bool:
        assert self.answer is None
        self.answer = data
        return True

    def batch(self):
        assert self.answer is not None and self.answer[:1] == PoolOp.TASKS
        return serialization.loads(memoryview(self.answer)[1:])


class _Sink:
    def __init__(self) -> None:
        self.outcomes: list = []

    def _set(self, start, count, ok, value) -> None:
        self.outcomes.append((start, count, ok, value))


class _CountingDeque(collections.deque):
    """The table's queue, counting what goes in and out."""

    ops = 0

    def append(self, x):
        type(self).ops += 1
        super().append(x)

    def popleft(self):
        type(self).ops += 1
        return super().popleft()


def test_a_call_for_an_idle_worker_passes_no_queue():
    """Fakes the wire (lines) and counts the queue's operations: a call submitted while
    a worker idles is sent to it as a batch of one (its first asks for the give line
    and brings the function), and the queue is not touched; a second call, with the
    worker busy, goes to its other line as before. Before the flat path every call
    went through the queue (append, then popleft)."""
    s = Scheduler(2, 3)
    s.queue = _CountingDeque()
    (w,) = s.new_workers(1)
    lines = {line: _Line(1000) for line in (0, 1)}
    for line, request in lines.items():
        s.ready(w, line, request)
    first = s.submit_call(square, (3,), None, _Sink())
    assert _CountingDeque.ops == 0
    flags, batch = lines[0].batch()
    # (KEPT since the third pass: the worker's task in progress, never recalled)
    assert flags == BatchFlag.OPEN_GIVE | BatchFlag.KEPT
    assert [(tid, kind, payload) for tid, _, _, kind, payload in batch] == \
        [(first.id, TaskKind.CALL, ((3,), {}))]
    assert batch[0][2] is not None  # the function travels with the first call
    assert first.worker is w and w.held == {0: {first.id: first}} and s.outstanding == 1
    # busy now: the next call is queued and taken in advance on the other line
    second = s.submit_call(square, (4,), None, _Sink())
    assert _CountingDeque.ops == 2 and not s.queue
    flags, batch = lines[1].batch()
    assert not flags and batch[0][0] == second.id and batch[0][2] is None
    assert w.dispatched == 2 and s.holders  # it holds a task it has not started


def pid_after(path: str, seconds: float) -> int:
    """Write this process's pid to ``path`` (appending), then sleep."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
    finally:
        os.close(fd)
    time.sleep(seconds)
    return os.getpid()


def test_a_call_sent_directly_runs_again_when_its_worker_is_killed(tmp_path):
    """Real pool, real SIGKILL: a call sent at once to an idle worker, whose worker is
    killed while it runs, runs again on another worker and ``get()`` returns its
    result (within seconds), as a queued one did."""
    log = tmp_path / "starts"
    with fiber.Pool(2) as pool:
        pool.map(abs, range(4))  # both workers up and idle
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
        assert pool.stats().lost >= 1


def test_a_loop_of_calls_keeps_to_the_worker_of_the_last_result():
    """Real pool: sequential ``apply`` calls on an idle Pool(3) all go to the worker
    whose result came last (its connection is the one the caller read last, still out
    of the stream selector), as the floor's loop keeps to one socket; before, idle
    workers took turns (3 pids). Calls submitted together still spread over the idle
    workers."""
    with fiber.Pool(3) as pool:
        pool.map(abs, range(6))  # every worker up, both lines open
        deadline = time.monotonic() + 30
        while pool.stats().idle < 3:  # (the map's last results, read by the selector)
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pids = [pool.apply(os.getpid) for _ in range(30)]
        assert len(set(pids)) == 1
        together = [pool.apply_async(time.sleep, (0.5,)) for _ in range(3)]
        busy = pool.stats().busy
        for r in together:
            r.get(timeout=30)
        assert busy == 3


class _Echo:
    """A channel that answers each request with its payload, the ones starting with
    b"late" only when told to."""

    def __init__(self) -> None:
        self.late: list = []

    def handle(self, request, payload) -> None:
        data = bytes(payload)
        if data.startswith(b"late"):
            self.late.append((request, data))
        else:
            request.reply(data)

    def peer_gone(self, peer: int) -> None:
        pass


class _CountingCondition:
    """Wraps the client's Condition (a fake layer), counting its uses."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.entered = 0

    def __enter__(self):
        self.entered += 1
        return self.cond.__enter__()

    def __exit__(self, *exc):
        return self.cond.__exit__(*exc)

    def wait(self, timeout=None):
        return self.cond.wait(timeout)

    def notify_all(self):
        self.cond.notify_all()


def test_a_lone_reader_takes_its_replies_without_the_condition():
    """Real hub and client; the client's Condition is wrapped to count its uses (a
    fake layer). A thread that is the only one waiting reads its replies itself and
    enters no Condition (before: three per reply); with a second thread waiting on
    another line, each still gets its own reply."""
    hub = transport.Hub("127.0.0.1")
    echo = _Echo()
    cid = hub.add_channel(echo, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        ctx = client.context()
        counting = _CountingCondition(client._cond)
        client._cond = counting  # type: ignore[assignment]
        for i in range(50):
            assert ctx.request(cid, b"n%d" % i, timeout=10) == b"n%d" % i
        assert counting.entered == 0

        # two threads: one waits for a late reply, the other's comes first
        other = client.context()
        got: dict[str, bytes] = {}

        def late() -> None:
            got["late"] = other.request(cid, b"late", timeout=10)

        thread = threading.Thread(target=late)
        thread.start()
        deadline = time.monotonic() + 10
        while not echo.late:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert ctx.request(cid, b"first", timeout=10) == b"first"
        request, data = echo.late.pop()
        request.reply(data)
        thread.join(10)
        assert got == {"late": b"late"}
    finally:
        client.close()
        hub.close()
