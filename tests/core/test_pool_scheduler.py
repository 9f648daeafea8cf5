"""The pool's pending table (fiber.runtime.pool.scheduler), driven directly.

No pool, process or connection is involved: the workers and the wire are faked. A
worker is a record from ``Scheduler.new_workers``; its lines are ``FakeLine`` objects
that record the one answer the table gives them (a batch, or STOP); its results are
handed to ``Scheduler.results`` as the channel would after decoding them.
"""

from __future__ import annotations

import threading

import pytest

from fiber.errors import WorkerLostError
from fiber.runtime.pool.chunking import BATCH_ITEMS, MAX_BATCH
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import BUSY, IDLE, STARTING, STOPPING, Task
from fiber.wire import serialization
from fiber.wire.protocol import PoolOp, TaskKind


def square(x):
    return x * x


class FakeLine:
    """A worker's standing request: answered once."""

    def __init__(self, peer: int, alive: bool = True) -> None:
        self.peer = peer
        self.alive = alive
        self.answer: bytes | None = None

    def reply(self, data: bytes) -> bool:
        assert self.answer is None, "a line was answered twice"
        self.answer = data
        return self.alive

    @property
    def stopped(self) -> bool:
        return self.answer == PoolOp.STOP

    def batch(self) -> tuple[bool, list]:
        """The batch it carried: (suspect, [(task_id, func_id, code, kind, payload)])."""
        assert self.answer is not None and self.answer[:1] == PoolOp.TASKS
        return serialization.loads(memoryview(self.answer)[1:])


class Sink:
    """Records outcomes as a result object would receive them."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[int, int, bool, object]] = []

    def _set(self, start, count, ok, value) -> None:
        self.outcomes.append((start, count, ok, value))


def connect(s: Scheduler, w) -> dict[int, FakeLine]:
    """The worker ``w`` opens both lines."""
    lines = {line: FakeLine(peer=1000 + w.id) for line in (0, 1)}
    for line, request in lines.items():
        s.ready(w, line, request)
    return lines


def finish(s: Scheduler, w, line: int, request: FakeLine) -> tuple[FakeLine, list]:
    """The worker runs the batch ``request`` brought on ``line`` and sends its results
    (squares of the items) on a new request of that line."""
    _, batch = request.batch()
    results = [(tid, True, square(*payload[0]) if kind == TaskKind.CALL
                else [square(x) for x in payload])
               for tid, _, _, kind, payload in batch]
    again = FakeLine(peer=1000 + w.id)
    return again, s.results(w, line, again, results)


def table(target=2, **kwargs) -> Scheduler:
    kwargs.setdefault("attempts_limit", 3)
    return Scheduler(target, **kwargs)


def test_batches_grow_with_the_queue_and_big_chunks_go_alone():
    s = table(target=2)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    assert s.idle and not lines[0].answer  # nothing to do yet: parked, idle
    sink = Sink()
    s.submit_chunks(square, list(range(100)), 1, TaskKind.MAP, sink)
    # sized by the target (2 workers), not by the one worker up: 1 + 99 // 4, then
    # the other line takes one in advance: 1 + 74 // 4
    assert len(lines[0].batch()[1]) == 25
    assert len(lines[1].batch()[1]) == 19
    assert len(s.queue) == 56
    assert w.state == BUSY and w.dispatched == 44
    # the function travels once per worker
    codes = [code for _, _, code, _, _ in lines[0].batch()[1] + lines[1].batch()[1]]
    assert codes[0] is not None and codes[1:] == [None] * 43

    s2 = table(target=1)
    (w2,) = s2.new_workers(1)
    lines2 = connect(s2, w2)
    s2.submit_chunks(square, list(range(1000)), 1, TaskKind.MAP, Sink())
    assert len(lines2[0].batch()[1]) == MAX_BATCH + 1

    s3 = table(target=1)
    (w3,) = s3.new_workers(1)
    lines3 = connect(s3, w3)
    s3.submit_chunks(square, list(range(30)), 10, TaskKind.MAP, Sink())
    # small chunks share a batch as single items do (1 + 2 // 2), each one task
    assert [task[4] for task in lines3[0].batch()[1]] == [list(range(10)),
                                                          list(range(10, 20))]

    s4 = table(target=1)
    (w4,) = s4.new_workers(1)
    lines4 = connect(s4, w4)
    s4.submit_chunks(square, list(range(3 * BATCH_ITEMS)), BATCH_ITEMS, TaskKind.MAP,
                     Sink())
    (chunk,) = lines4[0].batch()[1]  # a chunk of BATCH_ITEMS goes alone
    assert chunk[4] == list(range(BATCH_ITEMS))
    s5 = table(target=1)
    (w5,) = s5.new_workers(1)
    lines5 = connect(s5, w5)
    s5.submit_chunks(square, list(range(80 * 100)), 100, TaskKind.MAP, Sink())
    # 1 + 79 // 2 = 40 chunks wanted, but a batch holds BATCH_ITEMS items at most
    assert len(lines5[0].batch()[1]) == BATCH_ITEMS // 100


def test_a_batch_takes_at_least_what_runs_in_a_recall_round_trip():
    """Once a batch of a map has measured its tasks (1 ms each by the worker's clock,
    passed to ``timed`` as the channel does) and a recall's round trip is known (20 ms,
    set as if measured), a batch of that map takes the tasks one round trip runs even
    when the queue is short (the 12 left of 40 for 4 workers went out 2 per batch, one
    per batch at the tail: issue #29). While a worker is starting, batches are sized as
    before (the first workers up do not take the work of the others)."""
    import time

    s = table(target=4)
    workers = s.new_workers(4)
    lines = [connect(s, w) for w in workers]
    s.submit_chunks(square, list(range(40)), 1, TaskKind.MAP, Sink())
    assert len(s.queue) == 12  # each worker holds two batches
    w1 = workers[0]
    n = len(lines[0][0].batch()[1])
    s.timed(w1, time.monotonic(), n, n * 0.001)
    s.recall_seconds = 0.02
    again, _ = finish(s, w1, 0, lines[0][0])
    assert len(again.batch()[1]) == 12 and not s.queue  # (1 + 11 // 8 = 2 before)

    s2 = table(target=4)
    w1, _ = s2.new_workers(2)
    lines1 = connect(s2, w1)
    s2.submit_chunks(square, list(range(40)), 1, TaskKind.MAP, Sink())
    n = len(lines1[0].batch()[1])
    s2.timed(w1, time.monotonic(), n, n * 0.001)
    s2.recall_seconds = 0.02
    again, _ = finish(s2, w1, 0, lines1[0])
    assert len(again.batch()[1]) < 12  # one is still starting: no least size


def noop(x):
    return x


def test_a_batch_is_not_sized_by_the_time_of_other_work():
    """A pool that measured fast tasks (a warm-up map of the same function, 10 us each
    by the workers' clock, passed to ``timed`` as the channel does) and a recall's
    round trip (1 ms, set as if measured) then gets another map of that function: its
    batches are sized as before until a batch of it is measured (the benchmark's map of
    10 ms sleeps after its warm-up of sleeps of 0 went out in batches of 128 to one
    worker and ran 2-5x slower than ideal)."""
    import time

    s = table(target=4)
    workers = s.new_workers(4)
    lines = [connect(s, w) for w in workers]
    s.submit_chunks(square, list(range(8)), 1, TaskKind.MAP, Sink())
    for w, ls in zip(workers, lines, strict=True):
        for line in (0, 1):
            if ls[line].answer is not None:
                n = len(ls[line].batch()[1])
                s.timed(w, time.monotonic(), n, n * 1e-5)
                finish(s, w, line, ls[line])
    assert s.task_seconds == pytest.approx(1e-5)  # measured
    s.recall_seconds = 0.001
    s.submit_chunks(square, list(range(10)), 1, TaskKind.MAP, Sink())
    assert len(s.queue) < 10 and max(len(b) for w in workers for b in w.held.values()) <= 2


def test_results_are_delivered_and_the_line_takes_the_next_batch():
    s = table(target=2)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    sink = Sink()
    s.submit_chunks(square, list(range(3)), 1, TaskKind.MAP, sink)
    assert [len(lines[n].batch()[1]) for n in (0, 1)] == [1, 1]
    again, done = finish(s, w, 0, lines[0])
    assert [(t.start, ok, value) for t, ok, value in done] == [(0, True, [0])]
    assert list(w.order) == [1, 0]  # the worker now runs line 1's batch
    assert len(again.batch()[1]) == 1  # line 0 took the last task in advance
    _, done = finish(s, w, 1, lines[1])
    _, done2 = finish(s, w, 0, again)
    assert [t.start for t, _, _ in done + done2] == [1, 2]
    assert w.state == IDLE and not s.unfinished()
    assert s.done == 3 and s.failed == 0


def test_no_prefetch_while_workers_start_unless_the_queue_is_long():
    s = table(target=4)
    first, *others = s.new_workers(4)
    assert s.starting == 4 and {w.state for w in others} == {STARTING}
    lines = connect(s, first)
    assert s.starting == 3
    s.submit_chunks(square, list(range(4)), 1, TaskKind.MAP, Sink())
    # one task for the worker that is up; three stay for the three starting
    assert len(lines[0].batch()[1]) == 1
    assert lines[1].answer is None and len(s.queue) == 3
    # more than the starting workers will take: the busy worker takes a batch ahead
    s.submit_chunks(square, list(range(40)), 1, TaskKind.MAP, Sink())
    assert lines[1].answer is not None and len(first.held) == 2
    # a worker that connects now gets work at once
    late = connect(s, others[0])
    assert late[0].answer is not None


def test_lost_worker_requeues_and_splits_its_running_chunk():
    s = table(target=2)
    (w1,) = s.new_workers(1)
    lines = connect(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(6)), 3, TaskKind.MAP, sink)
    running, ahead = lines[0].batch()[1], lines[1].batch()[1]
    assert [t[4] for t in running + ahead] == [[0, 1, 2], [3, 4, 5]]
    assert s.lose(w1) == []
    assert s.lost_workers == 1 and w1.id not in s.workers
    # the running chunk comes back as single suspect items, then the chunk held ahead
    assert [(t.start, t.count, t.alone, t.attempts) for t in s.queue] == [
        (0, 1, True, 1), (1, 1, True, 1), (2, 1, True, 1), (3, 3, False, 0)]
    (w2,) = s.new_workers(1)
    assert s.replaced == 1 and s.started == 2
    lines2 = connect(s, w2)
    suspect, batch = lines2[0].batch()
    assert suspect and len(batch) == 1  # a suspect task runs alone


def test_a_poison_task_fails_alone_after_its_attempts():
    s = table(target=1, attempts_limit=2)
    sink = Sink()
    s.submit_call(square, (7,), None, sink)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    assert s.lose(w) == []  # attempt 1: requeued, alone
    (task,) = s.queue
    assert task.alone and task.attempts == 1
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    # its worker dies before confirming that it started the task: not an attempt
    assert s.lose(w) == [] and task.attempts == 1
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    assert lines[0].batch()[0] is True
    s.started_batch(w, 0)
    failed = s.lose(w)
    assert [(t, ok) for t, ok, _ in failed] == [(task, False)]
    assert isinstance(failed[0][2], WorkerLostError) and "args=(7,)" in str(failed[0][2])
    assert task.done and not s.queue and s.failed == 1


def test_late_results_of_a_lost_worker_are_accepted_once():
    s = table(target=2)
    (w1,) = s.new_workers(1)
    lines1 = connect(s, w1)
    sink = Sink()
    s.submit_chunks(square, list(range(2)), 1, TaskKind.MAP, sink)
    (running,), (ahead,) = lines1[0].batch()[1], lines1[1].batch()[1]
    s.lose(w1)
    (w2,) = s.new_workers(1)
    lines2 = connect(s, w2)  # takes both tasks again
    # results w1 sent before it was given up: each accepted once
    late = s.lost_results(w1.id, [(running[0], True, [0]), (ahead[0], True, [1]),
                                  (running[0], True, [0])])
    assert [t.start for t, _, _ in late] == [0, 1]
    _, done = finish(s, w2, 0, lines2[0])
    assert done == []  # already delivered: not twice
    assert s.done == 2


def test_late_result_of_a_split_chunk_is_not_taken():
    s = table(target=1)
    w1, = s.new_workers(1)
    lines = connect(s, w1)
    s.submit_chunks(square, list(range(3)), 3, TaskKind.MAP, Sink())
    (chunk,) = lines[0].batch()[1]
    s.lose(w1)
    # its items run instead: the chunk's own result would deliver them twice
    assert s.lost_results(w1.id, [(chunk[0], True, [0, 1, 4])]) == []
    assert len(s.queue) == 3


def test_a_batch_sent_to_a_gone_worker_goes_back_to_the_queue():
    s = table(target=1)
    (w,) = s.new_workers(1)
    s.ready(w, 0, FakeLine(peer=1, alive=False))
    s.submit_call(square, (2,), None, Sink())
    assert len(s.queue) == 1 and not w.held and w.dispatched == 0


def test_maxtasksperchild_limits_batches_and_stops_the_worker():
    s = table(target=1, maxtasks=2)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    s.submit_chunks(square, list(range(100)), 1, TaskKind.MAP, Sink())
    # the first batch is cut to the worker's limit; nothing more is sent to it
    assert len(lines[0].batch()[1]) == 2 and lines[1].answer is None
    again, done = finish(s, w, 0, lines[0])
    assert len(done) == 2
    assert again.stopped and lines[1].stopped  # both lines retired: the worker exits
    assert w.state == STOPPING and w.stopping
    s.lose(w)  # its job ends
    assert s.lost_workers == 0  # it was let go, not lost
    assert len(s.queue) == 98


def test_close_stops_idle_workers_once_everything_is_done():
    s = table(target=2)
    w1, w2 = s.new_workers(2)
    lines1, lines2 = connect(s, w1), connect(s, w2)
    s.submit_call(square, (3,), None, Sink())
    s.close()
    assert s.state == "CLOSE" and not lines2[0].stopped  # a task is still running
    with pytest.raises(ValueError, match="not running"):
        s.submit_call(square, (4,), None, Sink())
    again, done = finish(s, w1, 0, lines1[0])
    assert len(done) == 1
    assert all(line.stopped for line in (again, lines1[1], lines2[0], lines2[1]))
    assert w1.state == STOPPING == w2.state


def test_a_closed_pool_waits_for_its_imap_feeders():
    """close() with a feeder still reading: idle workers stay for what it submits
    (a feeder may submit after close, nobody else may), and stop once it ended."""
    s = table(target=1)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    s.feeding += 1
    s.close()
    assert not lines[0].stopped and not lines[1].stopped
    with pytest.raises(ValueError, match="not running"):
        s.submit_chunks(square, [1, 2], 1, TaskKind.MAP, Sink())
    sink = Sink()
    s.submit_chunks(square, [5, 6], 2, TaskKind.MAP, sink, start=40, fed=True)
    again, done = finish(s, w, 0, lines[0])
    assert [(t.start, t.count, ok, value) for t, ok, value in done] == [
        (40, 2, True, [25, 36])]
    assert not lines[1].stopped and not again.stopped  # the feeder may send more
    s.feed_ended()
    assert lines[1].stopped and again.stopped
    s2 = table(target=1)
    s2.terminate()
    with pytest.raises(ValueError, match="not running"):
        s2.submit_chunks(square, [1], 1, TaskKind.MAP, Sink(), fed=True)


def test_terminate_fails_what_is_pending_and_break_refuses_work():
    s = table(target=1)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    sink = Sink()
    s.submit_chunks(square, list(range(4)), 1, TaskKind.MAP, sink)
    assert lines[0].answer and lines[1].answer
    failed = s.terminate()
    assert failed is not None and len(failed) == 4
    assert all(not ok and isinstance(v, ValueError) for _, ok, v in failed)
    assert s.terminate() is None
    assert s.lose(w) == [] and s.lost_workers == 0

    s2 = table(target=1)
    s2.submit_call(square, (1,), None, Sink())
    failed = s2.break_(OSError("no room for jobs"))
    assert len(failed) == 1 and isinstance(failed[0][2], OSError)
    with pytest.raises(OSError, match="no room"):
        s2.submit_call(square, (2,), None, Sink())


def test_an_unpicklable_argument_fails_its_task_only():
    s = table(target=1)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    sink = Sink()
    s.submit_call(square, (threading.Lock(),), None, sink)  # cannot be pickled
    assert sink.outcomes and sink.outcomes[0][2] is False
    assert lines[0].answer is None and s.failed == 1
    s.submit_call(square, (3,), None, sink)
    assert lines[0].answer is not None


def test_task_describes_itself():
    call = Task(0, 0, TaskKind.CALL, ((1, 2), {"k": 3}), Sink(), 0, 1)
    assert call.describe() == "call with args=(1, 2) kwds={'k': 3}"
    item = Task(1, 0, TaskKind.MAP, ["x"], Sink(), 5, 1)
    assert item.describe() == "item 5 ('x')"


def test_results_sent_as_tasks_finish_are_done_at_once():
    s = table(target=1)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    sink = Sink()
    s.submit_chunks(square, list(range(10)), 1, TaskKind.MAP, sink)
    _, batch = lines[0].batch()
    assert len(batch) == 5  # 1 + 9 // 2
    ids = [tid for tid, _, _, _, _ in batch]
    # the worker reports its first two tasks while it runs the third
    done = s.partial(w, 0, [(ids[0], True, [0]), (ids[1], True, [1])])
    assert [t.start for t, _, _ in done] == [0, 1] and s.done == 2
    assert [t.id for t in w.running()] == ids[2:]
    assert s.partial(w, 0, [(ids[1], True, [1])]) == []  # never twice
    # the line's request brings the rest; the batch is over
    again = FakeLine(peer=1000 + w.id)
    done = s.results(w, 0, again, [(tid, True, [0]) for tid in ids[2:]])
    assert [t.start for t, _, _ in done] == [2, 3, 4] and s.done == 5
    assert list(w.order) == [1, 0]  # line 1's batch runs; line 0 took one ahead
    assert not set(w.held[0]) & set(ids)


def test_a_lost_worker_requeues_only_the_tasks_without_a_result():
    s = table(target=2)
    (w,) = s.new_workers(1)
    lines = connect(s, w)
    s.submit_chunks(square, list(range(40)), 1, TaskKind.MAP, Sink())
    running = [tid for tid, _, _, _, _ in lines[0].batch()[1]]
    ahead = [tid for tid, _, _, _, _ in lines[1].batch()[1]]
    s.partial(w, 0, [(tid, True, [0]) for tid in running[:3]])
    assert s.lose(w) == []
    queued = list(s.queue)
    # the task in progress (an attempt), the rest of its batch (not started: suspects
    # without an attempt, each alone), then the batch held ahead as it was
    n = len(running) - 3
    assert [t.id for t in queued[:n]] == running[3:]
    assert (queued[0].alone, queued[0].attempts) == (True, 1)
    assert all(t.alone and t.attempts == 0 and not t.started for t in queued[1:n])
    assert [t.id for t in queued[n:n + len(ahead)]] == ahead
    assert not any(t.alone for t in queued[n:])
    assert all(tid not in {t.id for t in queued} for tid in running[:3])
    # a result of the lost worker that was on its way is still taken, once
    (w2,) = s.new_workers(1)
    late = s.lost_results(w.id, [(running[3], True, [9])])
    assert [t.id for t, _, _ in late] == [running[3]]
    lines2 = connect(s, w2)
    assert lines2[0].batch()[1][0][0] == running[4]  # the delivered one is skipped


def test_a_map_queued_a_group_at_a_time_is_batched_by_all_it_will_queue():
    """With 2,000 lines parked (1,000 workers, faked as in this module), a map queues
    its first group of 1,024 tasks telling that 48,976 follow: batches are sized by the
    50,000 (1 + 50,000 // 2,000 = 26 tasks each, before the queue runs low), not by the
    1,024 queued (which went out one task per batch: 1,024 // 2,000 = 0 more)."""
    s = table(target=1000)
    workers = s.new_workers(1000)
    lines = [connect(s, w) for w in workers]
    s.submit_chunks(square, list(range(50_000)), 1, TaskKind.MAP, Sink(),
                    first=0, last=1024, ahead=48_976)
    sizes = [len(ls[line].batch()[1]) for ls in lines for line in (0, 1)
             if ls[line].answer is not None]
    assert sizes[0] == 1 + (1023 + 48_976) // 2000
    assert sum(sizes) == 1024 and len(sizes) < 60, sizes
