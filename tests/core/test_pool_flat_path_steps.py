"""Steps taken out of the per-task path of ``apply_async(...).get()`` (issue #29, the
second pass; bench/results/floor/ANALYSIS.md): each test pins one of them, and the
guarantee next to it.

Layers faked, as each test says: the pending table is driven with fake lines (as
tests/core/test_pool_scheduler.py does); the Giver gets a fake client (it only opens a
context); a listening connection is read over a real socket pair, its leftovers buffer
replaced by one that counts its uses. The direct-read test runs a real hub and client.
"""

from __future__ import annotations

import socket
import threading
import time

from fiber.runtime.pool.giver import Giver
from fiber.runtime.pool.lines import Handoff
from fiber.runtime.pool.scheduler import Scheduler
from fiber.wire import transport
from fiber.wire.stream import server
from fiber.wire.stream.accepted import _Connection
from fiber.wire.stream.client import StreamClient
from fiber.wire.stream.framing import FRAME


def square(x):
    return x * x


class _Sink:
    def __init__(self) -> None:
        self.outcomes: list = []

    def _set(self, start, count, ok, value) -> None:
        self.outcomes.append((start, count, ok, value))


class _Line:
    """A worker's standing request (fake): at its answer, records what the table had
    recorded of the batch by then; ``gone`` answers as a worker that left."""

    def __init__(self, scheduler: Scheduler, w, gone: bool = False) -> None:
        self.peer = 1000
        self.scheduler, self.w, self.gone = scheduler, w, gone
        self.seen: tuple | None = None

    def reply(self, data: bytes) -> bool:
        self.seen = (dict(self.w.held), self.w.dispatched, self.scheduler.outstanding)
        return not self.gone


def test_a_batch_is_sent_before_it_is_recorded():
    """Fake lines. The table answers the worker's line first and records the batch
    after (the worker runs it meanwhile; the caller holds the pool's lock, so nothing
    reads the records before they are made); a line whose worker is gone still puts
    the call back in the queue, with no worker, nothing recorded."""
    s = Scheduler(2, 3)
    (w,) = s.new_workers(1)
    lines = {0: _Line(s, w), 1: _Line(s, w)}
    for line, request in lines.items():
        s.ready(w, line, request)
    task = s.submit_call(square, (3,), None, _Sink())
    assert lines[0].seen == ({}, 0, 0)  # nothing recorded when it was sent
    assert w.held == {0: {task.id: task}} and w.dispatched == 1 and s.outstanding == 1
    assert task.worker is w

    s2 = Scheduler(2, 3)
    (w2,) = s2.new_workers(1)
    gone = {0: _Line(s2, w2, gone=True), 1: _Line(s2, w2, gone=True)}
    for line, request in gone.items():
        s2.ready(w2, line, request)
    lost = s2.submit_call(square, (4,), None, _Sink())
    assert list(s2.queue) == [lost] and lost.worker is None
    assert not w2.held and w2.dispatched == 0 and s2.outstanding == 0


def test_the_giver_says_how_many_it_gave_back_as_the_batch_ends():
    """Fake client (the Giver only opens a context on it here). Ending a batch and
    counting the tasks given back of it take one lock round: ``end_batch`` returns the
    count (``given_back`` said it before, in a round of its own)."""

    class _Client:
        def context(self):
            return object()

    giver = Giver(_Client(), cid=5, worker_id=9)
    giver.line = 0
    assert giver.begin(1)
    assert giver.grant(0, 1, [1, 2, 3]) == [2, 3]
    assert giver.end_batch() == 2
    giver.line = 1
    assert giver.begin(7)
    assert giver.end_batch() == 0


def test_the_handoff_passes_the_handlers_arguments_when_run_and_when_queued():
    """Real locks and threads. ``Handoff.run(handler, *args)`` runs ``handler(*args)``
    (no partial made per request); queued behind a busy lock by a shared reader (a
    thread marked as a selector thread), the handlers keep their arguments and their
    order, and what they return runs after the lock is released."""
    lock = threading.RLock()
    handoff = Handoff(lock)
    calls: list = []

    def handler(*args):
        assert lock._is_owned()  # type: ignore[attr-defined]
        calls.append(args)
        return lambda: calls.append(("after", args, lock._is_owned()))  # type: ignore[attr-defined]

    handoff.run(handler, 1, "a")
    assert calls == [(1, "a"), ("after", (1, "a"), False)]

    calls.clear()
    lock.acquire()

    def selector() -> None:
        server._selector_thread.on = True
        handoff.run(handler, 2, "b")
        handoff.run(handler, 3, "c")

    thread = threading.Thread(target=selector)
    thread.start()
    thread.join(10)
    assert handoff.queued == 2 and calls == []  # queued, not waited for
    lock.release()
    deadline = time.monotonic() + 10
    while len(calls) < 4:
        assert time.monotonic() < deadline, calls
        time.sleep(0.01)
    assert calls == [(2, "b"), (3, "c"), ("after", (2, "b"), False),
                     ("after", (3, "c"), False)]


class _CountingBuffer(bytearray):
    """A connection's leftovers buffer, counting the reads that pass through it."""

    uses = 0

    def __iadd__(self, other):
        type(self).uses += 1
        return super().__iadd__(other)


def test_a_lone_whole_frame_is_read_without_the_leftovers_buffer():
    """A real socket pair; the connection's leftovers buffer is replaced by one that
    counts its uses. A read that brings exactly one whole frame returns it without
    passing that buffer; two frames in one read and a frame split over two reads still
    go through it, and come out whole and in order."""
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        conn = _Connection(None, ours)  # type: ignore[arg-type]  # (the listener is not used to read)
        conn._inbuf = _CountingBuffer()

        def frame(line: int, body: bytes) -> bytes:
            return FRAME.pack(len(body), line) + body

        def read_all(expected: int) -> list:
            got: list = []
            deadline = time.monotonic() + 10
            while len(got) < expected:
                assert time.monotonic() < deadline
                got += conn.read()
            return got

        theirs.sendall(frame(3, b"one"))
        assert read_all(1) == [(3, b"one")]
        assert _CountingBuffer.uses == 0
        theirs.sendall(frame(1, b"two") + frame(2, b"three"))
        assert read_all(2) == [(1, b"two"), (2, b"three")]
        whole = frame(4, b"split" * 10)
        theirs.sendall(whole[:7])
        time.sleep(0.05)
        assert conn.read() == []
        theirs.sendall(whole[7:])
        assert read_all(1) == [(4, b"split" * 10)]
        assert _CountingBuffer.uses >= 2 and not conn._inbuf
    finally:
        ours.close()
        theirs.close()


class _Parking:
    """A channel that parks every request (a worker's line waiting for a batch)."""

    def __init__(self) -> None:
        self.parked: list = []

    def handle(self, request, payload) -> None:
        self.parked.append(request)

    def peer_gone(self, peer: int) -> None:
        pass


def test_direct_reads_of_a_connection_share_one_poll_object():
    """Real hub and client. Each ``get()`` of a loop reads its worker's connection
    directly; the reads of one connection use one poll object, made by the first (it
    was made, registered and dropped by every read before), and each read still ends
    when its request has come (private reads: the connection and its poll object)."""
    hub = transport.Hub("127.0.0.1")
    channel = _Parking()
    cid = hub.add_channel(channel, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        ctx = client.context()
        ctx.send(cid, b"first")
        deadline = time.monotonic() + 10
        while not channel.parked:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        request = channel.parked.pop()
        conn = request._conn
        pollers = []
        for i in range(3):
            threading.Timer(0.02, ctx.send, (cid, b"next%d" % i)).start()
            assert request.read_until(lambda: bool(channel.parked), 10)
            pollers.append(conn.poller)
            request = channel.parked.pop()
        assert pollers[0] is not None
        assert all(p is pollers[0] for p in pollers)
    finally:
        client.close()
        hub.close()
