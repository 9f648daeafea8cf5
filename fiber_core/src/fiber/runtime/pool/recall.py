"""Taking back tasks a worker holds but has not started (*recall*, work stealing): the
part of the pool's pending table (:mod:`~fiber.runtime.pool.scheduler`) that asks
holders for tasks, judges whether a recall is worth its round trip and requeues what a
worker gives back.

When a worker has nothing to do and the queue is empty, the table asks a holder, on
its *give line* (a standing ``GIVE`` request, asked for with the worker's first batch:
see :meth:`Scheduler.hand <fiber.runtime.pool.scheduler.Scheduler.hand>`), to give back
the later half of the tasks it has not started: those of its batch held in advance,
else its running batch's after the one in progress (:meth:`Recall.steal`). The worker
gives back the ones it has not begun and skips them; its next ``GIVE`` says which
(:meth:`Recall.given`), and those return to the front of the queue, so a worker that
comes up late, or runs dry at a map's tail, takes them. A task is never run by two
workers for a recall, and a recalled task counts no attempt. Suspect tasks are never
recalled. A holder is asked only when the recall is worth its round trip
(:meth:`Recall.worth_recalling`): its unstarted tasks would take it longer than a
recall takes (``recall_seconds``, measured; a task's time is its function's,
``fid_seconds``), or it is late (nothing heard from it for longer than two recalls and
two tasks). Otherwise the tasks would have begun before the recall reached the worker:
at 1,000 simulated workers of 1 ms tasks, 3,466 recalls in a map of 20,000 gave back
174 tasks (issue #29). A holder passed over stays listed; the worker set's supervisor
retries (:meth:`Recall.recall_late`, about once a second) while a worker is idle, so a
holder stuck in a long task does not keep the short ones after it.

:class:`Recall` is a base class of :class:`~fiber.runtime.pool.scheduler.Scheduler`,
not an object of its own: its state (``holders``, ``recall_seconds``, ...) lives on the
table, which hands batches out (and lists holders as it does) and recovers lost
workers with the same structures, under the same lock; so the per-task path
(``hand``, ``send_batch``, ``results``) reads it as plain attributes, with no call
layer more. What it uses of the table is declared below (:class:`Recall`'s
annotations).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fiber.runtime.pool.tasks import CLOSE, IDLE_LIST, TERMINATE, Line, Task, Worker
from fiber.wire import serialization
from fiber.wire.protocol import PoolOp

logger = logging.getLogger("fiber")

RECALL_LOOKS = 8  # holders one steal passes over (not worth a recall yet), at most

_STOP, _RECALL = PoolOp.STOP, PoolOp.RECALL
_monotonic = time.monotonic


class Recall:
    """The recall part of the pending table (see the module's docstring); every method
    expects its caller to hold the pool's lock."""

    # the table's, which the recall reads and moves tasks through (scheduler.py)
    state: str
    broken: Exception | None
    queue: collections.deque[Task]
    idle: collections.deque[Worker]
    outstanding: int
    fid_seconds: dict[int, float]
    notify: Callable[[], None]

    if TYPE_CHECKING:
        def unfinished(self) -> bool: ...
        def dispatch_waiting(self) -> None: ...
        def stop_idle(self) -> None: ...

    def init_recall(self) -> None:
        """The recall's state, empty (the table's ``__init__`` calls it)."""
        # workers that may hold tasks they have not started (checked when taken)
        self.holders: collections.OrderedDict[int, Worker] = collections.OrderedDict()
        self.recalled = 0  # tasks given back by a worker that had not started them
        # seconds from a RECALL sent to its GIVE read, lately (None until measured), and
        # when each recall under way was sent (by worker id)
        self.recall_seconds: float | None = None
        self.recall_sent: dict[int, float] = {}
        self.passed_over = False  # the last steal passed over holders (recall_late retries)

    @staticmethod
    def unstarted(w: Worker) -> tuple[int, list[Task]]:
        """A line of ``w`` and the tasks of its batch the worker has not started, as far
        as the table knows: its batch held in advance, else its running batch after the
        task in progress (suspect tasks excepted)."""
        if not w.held or not w.order:
            return 0, []
        first = w.order[0]
        for line in reversed(w.order):  # the batch held in advance first
            batch = w.held.get(line)
            if not batch:
                continue
            tasks = list(batch.values())
            if line == first:
                tasks = tasks[1:]  # the first without a result is in progress
            return line, [t for t in tasks if not t.done and not t.alone]
        return 0, []

    def steal(self) -> bool:
        """Ask one holder to give back the later half of the tasks it has not started
        (for a worker with nothing to do); False when no holder has any. A holder with
        a recall under way, or without its give line yet, leaves the list until its
        ``GIVE`` comes (:meth:`given`), so each holder is looked at once per change."""
        if self.state == TERMINATE or self.broken is not None:
            return False
        holders = self.holders
        now = _monotonic()
        passed: list[Worker] = []
        try:
            while holders:
                _, v = holders.popitem(last=False)
                if not v.alive or v.giving is None or v.dismissed:
                    continue
                # (at most this many unstarted: a cheap first look, as most are passed
                # over at a map's tail when tasks are short)
                most = sum(len(batch) for batch in v.held.values()) - 1
                fid = next((t.fid for b in v.held.values() for t in b.values()), None)
                if most > 0 and fid is not None \
                        and not self.worth_recalling(v, most, fid, now):
                    passed.append(v)  # listed again (at the end), for a later try
                    if len(passed) >= RECALL_LOOKS:
                        return False
                    continue
                line, tasks = self.unstarted(v)
                if not tasks:
                    continue
                if not self.worth_recalling(v, len(tasks), tasks[0].fid, now):
                    passed.append(v)
                    if len(passed) >= RECALL_LOOKS:
                        return False
                    continue
                take = tasks[len(tasks) // 2:]
                request, v.giving = v.giving, None
                data = serialization.dumps((line, v.sent[line], [t.id for t in take]))
                if request.reply(_RECALL + data):
                    v.recalling = {t.id: t for t in take}
                    v.recall_line = line
                    self.recall_sent[v.id] = now
                    self.outstanding += 1
                    return True
                # the worker is gone: lose() requeues what it held
            return False
        finally:
            for v in passed:
                holders[v.id] = v
            self.passed_over = bool(passed)

    def worth_recalling(self, v: Worker, unstarted: int, fid: int, now: float) -> bool:
        """Whether asking holder ``v`` for some of its ``unstarted`` tasks (of function
        ``fid``) is worth a recall's round trip: yes until both a task's time (of that
        function) and a recall's are measured; then when running them would take ``v``
        longer than a recall takes, or when ``v`` is late (nothing heard of its task in
        progress for longer than two recalls and two tasks: stuck in a long one)."""
        task, recall = self.fid_seconds.get(fid), self.recall_seconds
        if task is None or recall is None:
            return True
        return unstarted * task > recall or now - v.since > 2 * (recall + task)

    def recall_late(self) -> None:
        """Try again the recall the last steal passed over, while a worker waits with
        nothing to do and nothing is queued (the worker set's supervisor calls it
        about once a second: a holder passed over may since have become late)."""
        if not self.passed_over or self.queue or not self.holders:
            return
        for w in self.idle:
            if w.listed == IDLE_LIST and w.alive and not w.busy and not w.awaiting:
                w.awaiting = self.steal()
                return
        self.passed_over = False  # no worker waits

    def forget_recalls(self, w: Worker, held: set[int]) -> list[Task]:
        """``w`` is lost (the table's ``lose``): it is no holder, its recall under way is
        over; returns the tasks asked back that it no longer ``held`` (its batch ended
        without them: given back) and that are not done, to requeue."""
        self.holders.pop(w.id, None)
        self.recall_sent.pop(w.id, None)
        recalling, w.recalling = w.recalling, {}
        return [t for t in recalling.values() if not t.done and t.id not in held]

    def given(self, w: Worker, line: int, request: Line, ids: Iterable[int]) -> None:
        """The worker gave back ``ids`` (of the tasks recalled from it; the rest it had
        begun), and its give line is open again: requeue them at the front, hand them
        out, and take back more while workers wait for work."""
        w.giving = request
        recalling, w.recalling = w.recalling, {}
        if recalling:
            self.outstanding -= 1
        sent = self.recall_sent.pop(w.id, None)
        if sent is not None:
            took = _monotonic() - sent
            seen = self.recall_seconds
            self.recall_seconds = took if seen is None else seen + (took - seen) * 0.25
        back = []
        for tid in ids:
            task = recalling.get(tid)
            if task is None or task.done:
                continue
            batch = w.held.get(w.recall_line)
            if batch is not None:
                batch.pop(tid, None)
            task.worker = None
            back.append(task)
        if back:
            w.dispatched -= len(back)
            self.recalled += len(back)
            self.queue.extendleft(reversed(back))
            logger.debug("pool worker %d gave back %d task(s)", w.id, len(back))
        if w.dismissed and not w.held:
            w.giving = None
            request.reply(_STOP)
        elif self.unstarted(w)[1]:
            self.holders[w.id] = w
        if self.state == TERMINATE:
            return
        if back:
            self.dispatch_waiting()
        if not self.queue and self.idle and self.holders:
            self.steal()
        if self.state == CLOSE and not self.unfinished():
            self.stop_idle()
            self.notify()

