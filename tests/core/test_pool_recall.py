"""The pending table takes back tasks a worker holds but has not started (recall, or
work stealing: fiber.runtime.pool.scheduler), driven directly.

No pool, process or connection is involved: workers and the wire are faked as in
test_pool_scheduler.py. A worker's give line is a ``FakeLine`` handed to
``Scheduler.given``; the worker's side (which of the recalled tasks it gives back) is
played by the test, as the real worker's ``Giver`` would answer. The ``Giver`` itself
(the worker's side) is tested last over a fake connection that records what it sends.
The same protocol over real processes: test_pool_late_workers.py.
"""

from __future__ import annotations

import threading

from fiber.runtime.pool.giver import Giver
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import IDLE
from fiber.wire import serialization
from fiber.wire.protocol import PoolOp, TaskKind


def square(x):
    return x * x


class FakeLine:
    """A worker's standing request: answered once."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.answer: bytes | None = None

    def reply(self, data: bytes) -> bool:
        assert self.answer is None, "a line was answered twice"
        self.answer = data
        return True

    def batch(self) -> list:
        assert self.answer is not None and self.answer[:1] == PoolOp.TASKS, self.answer
        return serialization.loads(memoryview(self.answer)[1:])[1]

    def recall(self) -> tuple[int, int, list[int]]:
        """(line, batch number on that line, task ids) of a RECALL answer."""
        assert self.answer is not None and self.answer[:1] == PoolOp.RECALL, self.answer
        return tuple(serialization.loads(memoryview(self.answer)[1:]))


class Sink:
    def __init__(self) -> None:
        self.starts: list[int] = []

    def _set(self, start, count, ok, value) -> None:
        assert ok
        self.starts.extend(range(start, start + count))


def up(s: Scheduler, w) -> tuple[dict[int, FakeLine], FakeLine]:
    """The worker opens its two lines and its give line."""
    lines = {line: FakeLine(peer=1000 + w.id) for line in (0, 1)}
    for line, request in lines.items():
        s.ready(w, line, request)
    give = FakeLine(peer=1000 + w.id)
    s.given(w, 0, give, [])
    return lines, give


def results(s: Scheduler, w, line: int, request: FakeLine, skip=()) -> tuple[FakeLine, list]:
    """The worker ran the batch of ``line`` (but the tasks in ``skip``, given back) and
    reopens the line."""
    out = [(tid, True, [square(x) for x in payload])
           for tid, _, _, _, payload in request.batch() if tid not in skip]
    again = FakeLine(peer=1000 + w.id)
    return again, s.results(w, line, again, out)


def deliver(sink: Sink, done) -> None:
    for task, ok, value in done:
        # the sink's _set (multiprocessing's ApplyResult._set), called as channel.deliver does
        task.sink._set(task.start, task.count, ok, value)


def test_a_worker_that_comes_up_late_takes_back_a_task_held_in_advance():
    s = Scheduler(2, attempts_limit=3)
    w1, w2 = s.new_workers(2)
    lines1, give1 = up(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)
    # w1 runs task 0 and holds task 1 in advance (more tasks than starting workers)
    (t1,) = lines1[1].batch()
    lines2, give2 = up(s, w2)
    (t2,) = lines2[0].batch()
    again2, done = results(s, w2, 0, lines2[0])
    deliver(sink, done)
    # w2 has nothing to do and the queue is empty: w1 is asked for task 1 back
    assert give1.recall() == (1, 1, [t1[0]])
    assert s.unfinished() and not s.queue
    give1b = FakeLine(peer=1001)
    s.given(w1, 1, give1b, [t1[0]])  # w1 had not started it: given back
    assert s.recalled == 1 and w1.dispatched == 1 and give1b.answer is None
    # the idle worker got it (on the line it waits on next)
    (t1_again,) = lines2[1].batch()
    assert t1_again[0] == t1[0]
    _, done = results(s, w2, 1, lines2[1])
    deliver(sink, done)
    # w1 finishes task 0, then skips the batch it gave back: its results are empty
    again1, done = results(s, w1, 0, lines1[0])
    deliver(sink, done)
    _, done = results(s, w1, 1, lines1[1], skip={t1[0]})
    assert done == []
    assert sorted(sink.starts) == [0, 1, 2] and s.done == 3
    assert not s.unfinished() and w1.state == IDLE and w2.state == IDLE


def test_a_task_the_worker_had_begun_is_not_given_back():
    s = Scheduler(2, attempts_limit=3)
    w1, w2 = s.new_workers(2)
    lines1, give1 = up(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)
    (t1,) = lines1[1].batch()
    lines2, _ = up(s, w2)
    _, done = results(s, w2, 0, lines2[0])
    deliver(sink, done)
    assert give1.recall()[2] == [t1[0]]
    # w1 finished task 0 and began task 1 before the recall reached it
    _, done = results(s, w1, 0, lines1[0])
    deliver(sink, done)
    s.given(w1, 1, FakeLine(peer=1001), [])
    assert s.recalled == 0 and not s.queue and lines2[1].answer is None
    _, done = results(s, w1, 1, lines1[1])
    deliver(sink, done)
    assert sorted(sink.starts) == [0, 1, 2] and not s.unfinished()


def test_results_that_cross_a_recall_and_a_worker_lost_meanwhile():
    """The worker gives back the tail of its running batch and ends that batch (its
    results come before its GIVE): the task it skipped still counts as pending; when
    the worker is lost before its GIVE arrives, the task runs again elsewhere without
    counting an attempt (attempts_limit=1 would fail it otherwise)."""
    s = Scheduler(1, attempts_limit=1)
    (w1,) = s.new_workers(1)
    lines1, give1 = up(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(5)), 1, TaskKind.MAP, sink)
    running, ahead = lines1[0].batch(), lines1[1].batch()
    assert [len(running), len(ahead), len(s.queue)] == [3, 1, 1]
    s.target = 2
    (w2,) = s.new_workers(1)
    lines2, _ = up(s, w2)
    again2, done = results(s, w2, 0, lines2[0])  # the last queued task
    deliver(sink, done)
    # nothing queued: w2 asks w1 for the batch it holds in advance first
    assert give1.recall() == (1, 1, [ahead[0][0]])
    give1b = FakeLine(peer=1001)
    s.given(w1, 1, give1b, [ahead[0][0]])
    assert [t[0] for t in lines2[1].batch()] == [ahead[0][0]]
    _, done = results(s, w2, 1, lines2[1])
    deliver(sink, done)
    # then the later half of its running batch, never the task in progress
    line, number, tail = give1b.recall()
    assert (line, number, tail) == (0, 1, [running[2][0]])
    # w1's batch ends without that task (skipped), before its GIVE comes
    _, done = results(s, w1, 0, lines1[0], skip=set(tail))
    deliver(sink, done)
    assert s.unfinished() and not s.queue  # neither done nor queued, not forgotten
    assert s.lose(w1) == []
    assert [t[0] for t in again2.batch()] == tail  # the idle worker has it
    _, done = results(s, w2, 0, again2)
    deliver(sink, done)
    assert sorted(sink.starts) == [0, 1, 2, 3, 4] and s.failed == 0
    assert not s.unfinished()


def test_terminate_fails_the_tasks_of_a_recall_under_way():
    s = Scheduler(2, attempts_limit=3)
    w1, w2 = s.new_workers(2)
    lines1, give1 = up(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)
    (t1,) = lines1[1].batch()
    lines2, _ = up(s, w2)
    results(s, w2, 0, lines2[0])
    assert give1.recall()[2] == [t1[0]]
    results(s, w1, 1, lines1[1], skip={t1[0]})  # skipped, GIVE not there yet
    failed = s.terminate()
    assert failed is not None and t1[0] in {t.id for t, _, _ in failed}


class FakeContext:
    """A request line of a fake connection: records what is sent; ``recv`` blocks
    until the test ends (no RECALL comes: the test calls ``grant`` itself)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.sending = threading.Event()
        self.never = threading.Event()

    def send(self, channel: int, payload: bytes) -> None:
        self.sent.append(payload)
        self.sending.set()

    def recv(self, timeout=None) -> bytes:
        self.never.wait()
        return PoolOp.STOP

    def close(self) -> None:
        pass


def _holder_and_idle_worker(s: Scheduler, sink: Sink):
    """w1 runs task 0 and holds task 1 in advance; w2 comes up, runs task 2 and is
    idle with the queue empty: the moment a recall is considered."""
    w1, w2 = s.new_workers(2)
    lines1, give1 = up(s, w1)
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)
    (t1,) = lines1[1].batch()
    lines2, _ = up(s, w2)
    _, done = results(s, w2, 0, lines2[0])
    deliver(sink, done)
    return w1, w2, give1, t1[0]


def test_a_holder_whose_tasks_begin_before_a_recall_would_arrive_is_asked_once_late():
    """The table's estimates (a task's time, a recall's round trip) are set here as if
    measured: 1 ms tasks, 50 ms recalls. The holder's one unstarted task would begin
    long before a recall reached it, so none is sent (at 1,000 simulated workers 95% of
    the recalls gave nothing back, issue #29); once the holder is late (nothing heard
    for longer than two recalls and two tasks: stuck in a long task) the supervisor's
    retry (recall_late) asks it."""
    import time

    s = Scheduler(2, attempts_limit=3)
    s.fid_seconds[s.func_id(square)], s.recall_seconds = 0.001, 0.05
    sink = Sink()
    w1, w2, give1, t1 = _holder_and_idle_worker(s, sink)
    assert give1.answer is None, "a recall not worth its round trip was sent"
    assert w2.state == IDLE and not w2.awaiting and s.passed_over
    s.recall_late()  # not late yet: still nothing
    assert give1.answer is None
    time.sleep(0.2)  # > 2 * (0.05 + 0.001) since w1 began its task
    s.recall_late()
    assert give1.recall() == (1, 1, [t1]) and w2.awaiting
    s.given(w1, 1, FakeLine(peer=1001), [t1])
    assert s.recalled == 1
    assert s.recall_seconds is not None and s.recall_seconds < 0.05  # measured (~0 s)


def test_a_holder_with_long_tasks_is_asked_at_once_and_the_recall_is_timed():
    """Estimates set as if measured (0.5 s tasks, 50 ms recalls): the holder's task
    would take longer than a recall, so the idle worker asks for it at once; the
    recall's round trip updates the estimate."""
    s = Scheduler(2, attempts_limit=3)
    s.fid_seconds[s.func_id(square)], s.recall_seconds = 0.5, 0.05
    sink = Sink()
    w1, w2, give1, t1 = _holder_and_idle_worker(s, sink)
    assert give1.recall() == (1, 1, [t1]) and w2.awaiting
    s.given(w1, 1, FakeLine(peer=1001), [t1])
    assert s.recalled == 1 and s.recall_seconds is not None and s.recall_seconds < 0.05


class FakeClient:
    def __init__(self) -> None:
        self.ctx = FakeContext()

    def context(self) -> FakeContext:
        return self.ctx


def test_the_worker_gives_back_only_tasks_it_has_not_begun():
    client = FakeClient()
    giver = Giver(client, cid=5, worker_id=9)
    try:
        assert client.ctx.sent == []  # its give line opens when the master asks
        giver.open()
        assert client.ctx.sending.wait(10)
        assert client.ctx.sent[0][:1] == PoolOp.GIVE
        giver.line = 0  # running the first batch of line 0: tasks 1, 2, 3
        assert giver.begin(1)
        assert giver.grant(0, 1, [1, 2, 3]) == [2, 3]  # 1 has begun
        assert not giver.begin(2) and not giver.begin(3)  # skipped: given back
        # the batch held in advance on line 1, not received yet: all of it
        assert giver.grant(1, 1, [7, 8]) == [7, 8]
        giver.end_batch()
        # a recall of a batch that has ended gives nothing (its tasks all ran)
        assert giver.grant(0, 1, [1, 2]) == []
        giver.line = 1
        assert not giver.begin(7) and not giver.begin(8)
        giver.end_batch()
        # the next batch on line 0 is batch number 2 there
        giver.line = 0
        assert giver.grant(0, 2, [2]) == [2] and not giver.begin(2)
    finally:
        client.ctx.never.set()


def test_the_give_line_is_asked_for_once_and_stays_open():
    """A worker's first batch asks for its give line (flagged OPEN_GIVE), later ones do
    not, and the line stays open through batches sent with a long queue and nobody
    starting (the worker reads it on the job's connection: it costs nothing per batch),
    so a worker the pool grows by later can take back what the others hold."""
    from fiber.wire.protocol import BatchFlag

    def flags(line: FakeLine):
        return serialization.loads(memoryview(line.answer)[1:])[0]

    s = Scheduler(1, attempts_limit=3)
    (w1,) = s.new_workers(1)
    lines1 = {line: FakeLine(peer=1001) for line in (0, 1)}
    for line, request in lines1.items():
        s.ready(w1, line, request)
    sink = Sink()
    s.submit_chunks(square, list(range(100)), 1, TaskKind.MAP, sink)
    assert flags(lines1[0]) == BatchFlag.OPEN_GIVE and w1.give_open  # the first batch
    assert flags(lines1[1]) is False  # asked once
    give = FakeLine(peer=1001)
    s.given(w1, 0, give, [])  # the worker opened it
    # every batch from now on goes out with a long queue and nobody starting
    pending = dict(lines1)
    batches = 0
    while pending:
        line, request = next(iter(pending.items()))
        del pending[line]
        new, done = results(s, w1, line, request)
        deliver(sink, done)
        assert give.answer is None and w1.give_open  # still open
        if new.answer is not None and new.answer[:1] == PoolOp.TASKS:
            assert flags(new) is False
            batches += 1
            pending[line] = new
    assert batches > 2
    assert sorted(sink.starts) == list(range(100)) and not s.unfinished()
    # the pool grows: a late worker takes back from w1, whose line is still open
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)  # all 3 to w1
    assert not s.queue
    s.target = 2
    (w2,) = s.new_workers(1)
    lines2 = {line: FakeLine(peer=1002) for line in (0, 1)}
    for line, request in lines2.items():
        s.ready(w2, line, request)
    assert give.answer is not None and give.answer[:1] == PoolOp.RECALL
    again = FakeLine(peer=1001)
    s.given(w1, 0, again, [])  # it had begun them all meanwhile
    # open again, and asked again at once (w2 is still idle, w1 still holds tasks)
    assert again.answer is not None and again.answer[:1] == PoolOp.RECALL
