"""The pool's pending table: which tasks wait, which worker holds which, and what becomes
of them when a worker is lost.

It is plain bookkeeping: no processes, no threads, no connections. The hub channel
(:mod:`~fiber.runtime.pool.channel`) feeds it what workers send, the worker set
(:mod:`~fiber.runtime.pool.workers`) tells it of workers started and ended, and
:class:`fiber.Pool` submits tasks. Every method of :class:`Scheduler` expects its
caller to hold the pool's lock; outcomes it returns are delivered by the caller once the
lock is released (:func:`~fiber.runtime.pool.tasks.settle`,
:func:`fiber.runtime.pool.channel.deliver`). The records it keeps (:class:`Task`,
:class:`Worker`, the protocols of a sink and a line) are in :mod:`~fiber.runtime.pool.tasks`.

Over 500 lines, and kept so: it is one class with one job, the pending table. Its
parts (submitting, handing out batches, a lost worker's recovery, ending) all move
tasks between the same structures (the queue, each worker's lines and held batches, the
holders, the lost workers' tasks) and keep the same counts true together
(``outstanding``, ``starting``, ``connected``, ``done``, ``failed``): a task leaves one
place only as it enters another, in one method, under one lock. Split into objects,
every part would reach into the others' state to keep those invariants
(tests/core/test_pool_scheduler.py drives the whole table). The one part with a job of
its own, taking back tasks not started (*recall*), is written apart in
:mod:`~fiber.runtime.pool.recall`, and so is the cache of the tasks' functions
(:mod:`~fiber.runtime.pool.functions`): base classes whose state lives on the table, so
the per-task path reads it with no call layer more. A line it answers is anything with
``reply(data) -> bool``, which lets unit tests drive it with fakes.

Vocabulary:

* **task**: one ``apply`` call, or one chunk of a ``map`` (``count`` items).
* **line**: one of a worker's two standing requests on the pool's channel (0 and 1).
  A worker waits on its lines in strict alternation; the master mirrors that order in
  :attr:`Worker.order`, so the first line of the order is the one whose batch runs.
* **parked**: a line whose request the master holds unanswered, ready to carry a batch.
* **batch**: the tasks sent in one answer to a line, a unit of sending, not of
  reporting: the worker runs them in order and sends each result as its task finishes
  (``PARTIAL``, :meth:`Scheduler.partial`), so a task is done once its own result is in.
  A line *holds* its batch (the tasks without a result yet) until the worker reopens
  the line with the batch's last results (:meth:`Scheduler.results`).
* **idle** worker: connected and holding no batch; **spare** worker: running a batch
  with its other line parked, so it can take one in advance. The two lists of the
  table keep workers with a parked line, idle ones first.
* **prefetch**: a spare worker taking a batch in advance. Allowed only while the queue
  holds more tasks than the *starting* workers will take, so the first workers up do
  not take the work of the others.
* **starting** worker: asked for (its job is being started, or it runs its
  initializer) but not yet connected.
* **task in progress**: the first task of a worker's running batch without a result
  (the worker runs a batch in order and reports each task as it finishes). When the
  worker is lost, it counts an attempt; the batch's later tasks had not started.
* **suspect task**: one of a lost worker's running batch without a result. It runs
  again **alone** (a batch of one, flagged so that the worker confirms with ``STARTED``
  that it began it: only a real start counts as an attempt), so that a task that kills
  its worker is known even when the results before it were lost with the worker. A
  chunk in progress is **superseded** by its items, each a suspect task, so a poison
  item fails alone with :class:`~fiber.errors.WorkerLostError` after
  ``attempts_limit`` attempts.
* **lost results**: results that a lost worker had sent before it was given up; they
  are accepted once (a task is *done* when its outcome was delivered, and a done task
  is never delivered again), so nothing is lost nor delivered twice.
* **holder**: a worker holding tasks it has not started (a batch of several, or a batch
  taken in advance); listed in ``holders`` when it may hold some.
* **recall** (work stealing): a worker with nothing to do, and nothing queued, takes
  back, through the table, tasks a holder has not started
  (:mod:`~fiber.runtime.pool.recall` says when and how).
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from fiber.errors import WorkerLostError
from fiber.runtime.pool import chunking, observe
from fiber.runtime.pool.functions import Functions
from fiber.runtime.pool.recall import Recall
from fiber.runtime.pool.tasks import (
    CLOSE,
    IDLE_LIST,
    RUN,
    SPARE,
    TERMINATE,
    Line,
    Outcome,
    Sink,
    Task,
    Worker,
)
from fiber.wire import serialization
from fiber.wire.protocol import BatchFlag, PoolOp, TaskKind

logger = logging.getLogger("fiber")

LOST_KEPT = 64  # lost workers whose late results are still accepted

_STOP, _TASKS = PoolOp.STOP, PoolOp.TASKS
_CALL = TaskKind.CALL
_monotonic = time.monotonic
_weakref = weakref.ref


class Scheduler(Functions, Recall):
    """The pending table of one pool (see the module's docstring).

    ``target`` is the pool's size, ``attempts_limit`` how many workers a task may lose
    before it fails, ``maxtasks`` the pool's ``maxtasksperchild``; ``notify`` is called
    when the supervisor of the workers may have something to do.
    """

    def __init__(self, target: int, attempts_limit: int, maxtasks: int | None = None,
                 notify: Callable[[], None] | None = None) -> None:
        self.target = target
        self.attempts_limit = attempts_limit
        self.maxtasks = maxtasks
        self.notify: Callable[[], None] = notify or (lambda: None)
        self.state = RUN
        self.broken: Exception | None = None
        self.queue: collections.deque[Task] = collections.deque()
        # workers with a parked line: with nothing to do, and busy ones (prefetch)
        self.idle: collections.deque[Worker] = collections.deque()
        self.spare: collections.deque[Worker] = collections.deque()
        self.workers: dict[int, Worker] = {}  # every worker that is alive
        self.by_peer: dict[int, Worker] = {}
        self.starting = 0  # workers asked for that have not connected yet
        self.connected = 0  # workers alive that have connected
        # batches held by workers, plus workers with a recall under way: whether any
        # task is with a worker, without a pass over the workers
        self.outstanding = 0
        self.feeding = 0  # imap feeders still reading their input (pool.py's)
        self.start_failures = 0  # workers in a row that ended before connecting
        self.task_ids = itertools.count()
        self.worker_ids = itertools.count(1)
        self.init_functions()  # funcs, func_bytes (functions.py)
        self.init_recall()  # holders, recall_seconds, ... (recall.py)
        # tasks held by recently lost workers: their results may still be in flight
        self.lost: collections.OrderedDict[int, dict[int, Task]] = collections.OrderedDict()
        # counts for Pool.stats()
        self.done = 0  # tasks delivered with a value
        self.failed = 0  # tasks delivered with an error
        self.started = 0  # workers asked for, over the pool's life
        self.lost_workers = 0  # workers that ended without being let go
        self.replaced = 0  # workers started in place of lost ones
        self._unreplaced = 0
        # adapting (runtime/pool/adapt.py): a lost worker lowers the target, so that it
        # is replaced only if the adaptive policy still wants it
        self.adaptive = False
        self.errors = observe.errors_deque()  # the last failures (channel.py records them)
        self.lost_log = observe.lost_deque()  # the last lost workers (Pool.stats)
        # seconds a task (a call, or a chunk of a map) has taken lately: None until
        # measured (:meth:`timed`); long tasks are not batched
        self.task_seconds: float | None = None
        # the same per function (by func id), and the map (sink) whose batch measured
        # it last: a batch's least size is judged by the time of its own map's tasks
        # (the benchmark's warm-up of its sleep function with sleeps of 0 made the next
        # map, of 10 ms sleeps, go out in batches of 128 to one worker), the worth of a
        # recall by its function's
        self.fid_seconds: dict[int, float] = {}
        self.fid_sink: dict[int, weakref.ref[Sink]] = {}
        self.fid_hist: dict[int, list[int]] = {}  # its tasks' times (observe.add_time)
        # worker id * 2 + line -> its batch's first task, while the line holds the batch
        self.batch_first: dict[int, Task] = {}
        # tasks a map will still queue after its group just queued (submit_chunks'
        # ahead): batches are sized by them too, so that a map queued a group at a time
        # is batched as if queued at once (with thousands of lines parked, a group of
        # 1,024 went out one task per batch, issue #29)
        self.ahead = 0
        self.meter = observe.Meter()  # finished tasks over time (channel.py ticks it)
        self.recent: Worker | None = None  # the worker whose batch ended last

    # -- what fiber.Pool asks (its whole interface to the table; docs/architecture.md) --
    # Pool also calls check_running, submit_call, submit_chunks, feed_ended and close,
    # and hands the table itself to the parts that drive it (channel, worker set,
    # feeder, adapt driver, progress, stats.snapshot); it reads no attribute of it.
    def size(self) -> int:
        """The number of workers the pool aims to have."""
        return self.target

    def max_attempts(self) -> int:
        """How many workers a task may lose before it fails."""
        return self.attempts_limit

    def pool_state(self) -> str:
        """``RUN``, ``CLOSE`` or ``TERMINATE``."""
        return self.state

    def failure(self) -> Exception | None:
        """Why workers cannot be started (the pool is broken), or None."""
        return self.broken

    def processes(self) -> list[Any]:
        """The processes of the workers alive (those whose job was made)."""
        return [w.process for w in self.workers.values() if w.process is not None]

    def feed_started(self) -> None:
        """An imap's feeder is about to read its input: counted in :meth:`unfinished`
        until :meth:`feed_ended` (raises as :meth:`check_running` when not running)."""
        self.check_running()
        self.feeding += 1

    # -- what the imap feeder and the adapt driver ask (runtime/pool/feeder.py reads
    # pool_state and size and calls submit_chunks; runtime/pool/adapt.py uses the
    # methods below, plus pool_state, failure, size and unfinished): read-only views
    # and the two settings the driver owns; neither reads nor writes an attribute.
    def set_size(self, n: int) -> None:
        """The number of workers the pool aims to have from now on (the adapt driver's
        decision; the worker set's supervisor starts or lets go the difference)."""
        self.target = n

    def set_adaptive(self, on: bool) -> None:
        """Whether the pool adapts: a worker lost while it does lowers the target
        (:meth:`lose`), so it is replaced only if the next decision wants it."""
        self.adaptive = on

    def alive_workers(self) -> Iterable[Worker]:
        """The workers alive (a view: read it under the pool's lock)."""
        return self.workers.values()

    def queued(self) -> int:
        """The tasks waiting for a worker."""
        return len(self.queue)

    def task_time(self) -> float | None:
        """Seconds a task has taken lately (None until measured)."""
        return self.task_seconds

    # -- submitting -----------------------------------------------------------------
    def check_running(self) -> None:
        if self.state != RUN:
            raise ValueError("Pool not running")
        if self.broken is not None:
            raise self.broken

    def submit_call(self, func: Callable[..., Any], args: Iterable[Any],
                    kwds: Mapping[str, Any] | None, sink: Sink) -> Task:
        """Queue ``func(*args, **kwds)`` and hand out what can be. With nothing queued
        and a worker idle, the task goes to that worker at once (the worker
        :meth:`next_worker` would pick, as a batch of one): an ``apply_async`` round
        trip passes no queue and no batch sizing."""
        if self.state != RUN or self.broken is not None:
            self.check_running()
        task = Task(next(self.task_ids), self.func_id(func), _CALL,
                    (tuple(args), dict(kwds) if kwds else {}), sink, 0, 1, func)
        w = None if self.queue else self.idle_worker()
        if w is None:
            self.queue.append(task)
        else:
            line = w.free_line()
            assert line is not None  # idle_worker() returns workers with one
            sent = self.hand(w, line, [task], False)
            if w.free_line() is not None:
                self.relist(w)
            if sent:
                return task
            # (its worker is gone: hand() queued the task, for the others)
        self.dispatch_waiting()
        return task

    def submit_chunks(self, func: Callable[..., Any], items: Sequence[Any], chunksize: int,
                      kind: int, sink: Sink, start: int = 0, fed: bool = False, *,
                      first: int = 0, last: int | None = None, ahead: int = 0) -> None:
        """Queue ``items[first:last]`` (the input's items from index ``start`` on) in
        chunks of ``chunksize`` and hand out what can be. ``fed``: by the feeder of an
        imap submitted before the pool was closed (it may go on after ``close()``).
        ``ahead``: the tasks the caller will queue next (batches are sized by them too).
        A chunk is a slice of ``items`` (of a ``range``, a ``range``: it travels as
        three numbers, not as its items)."""
        if not (fed and self.state == CLOSE):
            self.check_running()
        elif self.broken is not None:
            raise self.broken
        fid = self.func_id(func)
        ids = self.task_ids
        end = len(items) if last is None else min(last, len(items))
        tasks: list[Task] = []
        add = tasks.append
        for i in range(first, end, chunksize):
            chunk = items[i:min(i + chunksize, end)]
            add(Task(next(ids), fid, kind, chunk, sink, start + i - first, len(chunk), func))
        self.queue.extend(tasks)
        self.ahead = ahead
        self.dispatch_waiting()

    def feed_ended(self) -> None:
        """A feeder (counted in ``feeding``) has stopped reading its input."""
        self.feeding -= 1
        if self.state != RUN:
            self.stop_idle()
            self.notify()

    # -- what workers send (called by the channel) ----------------------------------
    def timed(self, w: Worker, now: float, count: int, busy: float) -> None:
        """A batch of ``w`` ended, read at ``now`` (monotonic): ``count`` tasks ran for
        ``busy`` seconds by the worker's own clock, which updates :attr:`task_seconds`;
        its next task begins now (observe.py reads ``since``). (The interval between
        two results as the master reads them is no measure: at thousands of workers it
        is the master's own delay, and 1 ms tasks looked long, issue #29.)"""
        if count:
            sample = busy / count
            seen = self.task_seconds
            self.task_seconds = sample if seen is None else seen + (sample - seen) * 0.25
            first = self.batch_first.get(w.id * 2 + w.order[0]) if w.order else None
            if first is not None:  # (the first task of the batch ending)
                fid = first.fid
                seen = self.fid_seconds.get(fid)
                self.fid_seconds[fid] = sample if seen is None else seen + (sample - seen) * 0.25
                # weakly: a finished map's result object (and its values) is not kept
                # for it (the reference of a weakly referenced object is reused: no
                # new object per batch)
                try:
                    self.fid_sink[fid] = _weakref(first.sink)
                except TypeError:  # a sink without weak references: not told apart
                    self.fid_sink.pop(fid, None)
                observe.add_time(self.fid_hist, fid, sample, count)
        w.since = now

    def ready(self, w: Worker, line: int, request: Line) -> None:
        """A worker opened ``line``; its first one means it is up."""
        if not w.connected:
            w.connected = True
            self.starting -= 1
            self.connected += 1
            self.start_failures = 0
            w.peer = request.peer
            self.by_peer[request.peer] = w
        self.park(w, line, request)

    def started_batch(self, w: Worker, line: int) -> None:
        """The worker confirmed that it begins the (suspect) batch of ``line``."""
        for task in w.held.get(line, {}).values():
            task.started = True

    def partial(self, w: Worker, line: int,
                items: Iterable[tuple[int, bool, Any]]) -> list[Outcome]:
        """Results of tasks of the batch ``line`` holds, sent as they finished while the
        rest of the batch runs: each task is done now. Returns the outcomes to deliver
        (errors still packed)."""
        batch = w.held.get(line)
        done = []
        failed = 0
        if batch:
            for tid, ok, value in items:
                task = batch.pop(tid, None)
                if task is not None and not task.done:
                    task.done = True
                    done.append((task, ok, value))
                    if not ok:
                        failed += 1
        self.done += len(done) - failed
        self.failed += failed
        return done

    def results(self, w: Worker, line: int, request: Line,
                items: Iterable[tuple[int, bool, Any]]) -> list[Outcome]:
        """The last results of the batch ``line`` held (those not sent before with
        :meth:`partial`); the line is open again. Returns the outcomes to deliver
        (errors still packed)."""
        batch = w.held.pop(line, None)
        if batch is None:
            batch = {}
        else:
            self.outstanding -= 1
            # (timed() read it): its task and arguments are not kept past the batch
            self.batch_first.pop(w.id * 2 + line, None)
        done = []
        failed = 0
        for tid, ok, value in items:
            task = batch.pop(tid, None)
            if task is not None and not task.done:
                task.done = True
                done.append((task, ok, value))
                if not ok:
                    failed += 1
        self.done += len(done) - failed
        self.failed += failed
        if w.order and w.order[0] == line:
            w.order.rotate(-1)  # the worker now waits on its other line
        self.recent = w
        if self.lost and not self.outstanding and not self.queue:
            self.forget_done_lost()  # (nothing is with a worker: a map may be over)
        self.park(w, line, request)
        return done

    def forget_done_lost(self) -> None:
        """Drop the lost workers' tasks that are done (or superseded) from
        :attr:`lost`: a late result of theirs would be ignored anyway, and a finished
        map's tasks, with their arguments, are not kept for it."""
        for wid, tasks in list(self.lost.items()):
            for tid in [tid for tid, t in tasks.items() if t.done or t.superseded]:
                del tasks[tid]
            if not tasks:
                del self.lost[wid]

    def lost_results(self, wid: int, items: Iterable[tuple[int, bool, Any]]) -> list[Outcome]:
        """Results sent by worker ``wid`` before it was given up: each task not yet
        done (nor superseded) is accepted once."""
        lost = self.lost.get(wid)
        done = []
        failed = 0
        if lost:
            for tid, ok, value in items:
                task = lost.pop(tid, None)
                if task is not None and not task.done and not task.superseded:
                    task.done = True
                    done.append((task, ok, value))
                    if not ok:
                        failed += 1
        self.done += len(done) - failed
        self.failed += failed
        return done

    def park(self, w: Worker, line: int, request: Line) -> None:
        w.parked[line] = request
        w.wire = request
        self.offer(w)
        if self.state == CLOSE and not self.unfinished():
            self.notify()

    # -- handing out ----------------------------------------------------------------
    def unfinished(self) -> bool:
        """Whether a task is queued or with a worker (held, or being given back)."""
        return bool(self.queue) or self.feeding > 0 or self.outstanding > 0

    def offer(self, w: Worker) -> None:
        """A worker has a parked line: give it work, keep it, or stop it."""
        if w.stopping or (self.maxtasks is not None and w.dispatched >= self.maxtasks):
            w.stopping = True
            if not w.busy:
                self.stop_lines(w)
                self.notify()
            if self.state != RUN:
                self.stop_idle()  # this may have been the last result of a closed pool
            return
        while self.queue:
            line = w.free_line()
            if line is None or (w.busy and not self.may_prefetch()) \
                    or not self.send_batch(w, line):
                break
        if self.state != RUN and not self.unfinished():
            self.stop_lines(w)  # also a line that arrived after the others were stopped
            self.stop_idle()
            return
        if w.free_line() is None:
            return
        self.relist(w)
        if not w.busy and not w.awaiting and not self.queue and self.holders:
            w.awaiting = self.steal()  # nothing queued for it: take back what waits
        if self.state != RUN:
            self.stop_idle()

    def stop_lines(self, w: Worker) -> None:
        parked, w.parked = w.parked, {}
        if parked:
            w.dismissed = True
        for request in parked.values():
            request.reply(_STOP)
        if w.dismissed and w.giving is not None and not w.held:
            giving, w.giving = w.giving, None
            giving.reply(_STOP)

    def stop_idle(self) -> None:
        if self.unfinished():
            return
        for w in list(self.workers.values()):
            if not w.busy:
                self.stop_lines(w)

    def send_batch(self, w: Worker, line: int) -> bool:
        """Answer the worker's parked ``line`` with a batch from the queue; False when
        there was nothing to send, or the worker has had its ``maxtasks``. A worker's
        first batch asks it to open its give line, which stays open until the worker
        is dismissed."""
        if self.maxtasks is not None and w.dispatched >= self.maxtasks:
            return False
        queue = self.queue
        while queue and queue[0].done:
            queue.popleft()  # delivered late by a lost worker
        if not queue:
            return False
        # size batches by the pool's target size, not by the workers up so far: the
        # first workers to connect must not take the work of those still starting
        alive = max(1, self.target, self.connected)
        first = queue.popleft()
        batch = [first]
        # big chunks, and tasks long enough that batching saves nothing, go alone (one
        # task per batch keeps a map's tail even: every worker holds at most one ahead)
        if not first.alone and not chunking.goes_alone(first.count, self.task_seconds):
            size = chunking.batch_tasks(len(queue) + self.ahead, alive)
            # the tasks one recall's round trip runs, at least: once every worker is up,
            # by the time of this map's own tasks (measured on a batch of it)
            sink = self.fid_sink.get(first.fid)
            if not self.starting and sink is not None and sink() is first.sink:
                size = max(size, chunking.least_batch(self.fid_seconds.get(first.fid),
                                                      self.recall_seconds))
            if self.maxtasks is not None:
                size = min(size, self.maxtasks - w.dispatched - 1)
            items = first.count
            while size > 0 and queue and not queue[0].alone \
                    and items + queue[0].count <= chunking.BATCH_ITEMS:
                task = queue.popleft()
                if not task.done:
                    batch.append(task)
                    items += task.count
                    size -= 1
        return self.hand(w, line, batch, first.alone)

    def hand(self, w: Worker, line: int, batch: list[Task], alone: bool) -> bool:
        """Answer ``w``'s parked ``line`` with ``batch`` (taken from the queue, or a
        task just submitted; ``alone``: a suspect batch). False when the worker is gone:
        the batch is then back at the front of the queue. A task whose arguments cannot
        be pickled fails (True: something was done)."""
        # the give line is asked for with the worker's first batch and stays open (the
        # worker reads it on another connection: it costs no wake-up per batch)
        flags: int | bool = alone
        if not w.give_open and not alone:
            flags = BatchFlag.OPEN_GIVE
        if len(batch) == 1 and not w.held and not alone:
            # it runs at once, as the task in progress, which is never recalled
            # (unstarted()): the worker may skip its recall guard (a suspect batch, rare,
            # keeps its plain True)
            flags |= BatchFlag.KEPT
        wire = []
        for task in batch:
            if task.fid in w.funcs:
                code = None
            else:
                code = self.func_bytes[task.fid]
                w.funcs.add(task.fid)
            wire.append((task.id, task.fid, code, task.kind, task.payload))
        try:
            if w.forget:  # functions it has that were freed here: it drops them
                data = serialization.dumps((flags, wire, w.forget))
                w.forget = []
            else:
                data = serialization.dumps((flags, wire))
        except Exception as exc:  # noqa: BLE001 - an argument cannot be pickled
            for task in batch:
                task.done = True
                task.sink._set(task.start, task.count, False, exc)
            self.failed += len(batch)
            return True
        request = w.parked.pop(line)
        # sent first, recorded after: the worker runs the batch while the records are
        # made (nothing can read them meanwhile: the caller holds the pool's lock,
        # which the batch's results wait for)
        if not request.reply(_TASKS + data):
            # the worker is gone (lose() will not see this batch): back to the queue
            for task in reversed(batch):
                task.worker = None
                self.queue.appendleft(task)
            return False
        if not w.held:
            w.since = _monotonic()  # it begins this batch now (observe.py)
        w.held[line] = {task.id: task for task in batch}
        for task in batch:
            task.worker = w
        w.dispatched += len(batch)
        self.batch_first[w.id * 2 + line] = batch[0]
        w.sent[line] += 1
        w.awaiting = False
        self.outstanding += 1
        if flags & BatchFlag.OPEN_GIVE:
            w.give_open = True  # its GIVE comes
        if (len(batch) > 1 or len(w.held) > 1) and not alone:
            self.holders[w.id] = w  # it holds tasks it has not started
        return True

    def dispatch_waiting(self) -> None:
        """Queued tasks and parked lines: hand them out, idle workers first."""
        while self.queue:
            w = self.next_worker()
            if w is None:
                return
            line = w.free_line()
            assert line is not None  # next_worker() returns workers with one
            self.send_batch(w, line)
            if w.free_line() is not None:
                self.relist(w)

    def relist(self, w: Worker) -> None:
        """Keep ``w`` (which has a parked line) in the list that fits it: ``idle`` when
        it holds nothing, else ``spare``. A worker that moves leaves a stale entry in
        the other list, which :meth:`next_worker` skips."""
        want = SPARE if w.busy else IDLE_LIST
        if w.listed != want:
            w.listed = want
            (self.spare if want == SPARE else self.idle).append(w)

    def may_prefetch(self) -> bool:
        """Whether a busy worker may take a batch in advance: only when the queue holds
        more than the workers still starting will take (so the first workers up do not
        take the first tasks of the others)."""
        return len(self.queue) > self.starting

    def idle_worker(self) -> Worker | None:
        """A worker with nothing to do and a line to answer (the first choice of
        :meth:`next_worker`), or None: the one whose result came last, when that made
        it idle (:attr:`recent`), else the one idle longest. The worker of the last
        result has the connection read last (a caller in ``get()`` may still hold it
        out of the stream selector, so the next ``get()`` reads it with no system call
        more and no other thread sees its reply) and the process likeliest to be on a
        CPU: a loop of ``apply_async(...).get()`` keeps to one worker, as the floor's
        loop keeps to one socket."""
        idle = self.idle
        if idle:
            w = idle[-1]
            if w is self.recent and w.listed == IDLE_LIST:
                idle.pop()  # (relisted by that result: the last entry)
                w.listed = ""
                if self._usable(w):
                    return w
        return self._first_usable(idle, IDLE_LIST)

    def next_worker(self) -> Worker | None:
        """A worker with a line to answer: one with nothing to do, else a busy one (not
        one that has had its ``maxtasks``: it is let go once its results are in)."""
        w = self.idle_worker()
        if w is not None or not self.may_prefetch():
            return w
        return self._first_usable(self.spare, SPARE)

    def _usable(self, w: Worker) -> bool:
        """Whether ``w`` may be handed a batch now: alive, not stopping, with a line
        free and short of its ``maxtasks``."""
        return (w.alive and not w.stopping and w.free_line() is not None
                and (self.maxtasks is None or w.dispatched < self.maxtasks))

    def _first_usable(self, entries: collections.deque[Worker], tag: str) -> Worker | None:
        """The first usable worker of the list ``entries`` (whose entries say ``tag``
        in ``listed`` while they are on it), taken off it with the stale entries
        before it."""
        while entries:
            w = entries.popleft()
            if w.listed != tag:
                continue  # a stale entry: it moved to the other list
            w.listed = ""
            if self._usable(w):
                return w
        return None

    # -- the worker set's news ------------------------------------------------------
    def new_workers(self, n: int) -> list[Worker]:
        """Records for ``n`` workers about to be started (counted as starting)."""
        new = [Worker(next(self.worker_ids)) for _ in range(n)]
        for w in new:
            self.workers[w.id] = w
        self.starting += n
        self.started += n
        replacing = min(n, self._unreplaced)
        self.replaced += replacing
        self._unreplaced -= replacing
        return new

    def start_failed(self, w: Worker) -> None:
        """Starting ``w`` failed before it had a job."""
        if w.alive:
            w.alive = False
            self.starting -= 1
        self.workers.pop(w.id, None)

    def retire(self, w: Worker) -> None:
        """Let ``w`` go: it ends once the batches it holds are done."""
        w.stopping = True
        if not w.busy:
            self.stop_lines(w)

    def lose(self, w: Worker) -> list[Outcome]:
        """A worker is gone: put its tasks back, fail the ones out of attempts (returned,
        to be delivered with :func:`settle`)."""
        if not w.alive:
            return []
        w.alive = False
        if w.connected:
            self.connected -= 1
        else:
            self.starting -= 1
        self.outstanding -= len(w.held) + (1 if w.recalling else 0)
        self.workers.pop(w.id, None)
        if self.recent is w:
            self.recent = None  # (its record and process object are not kept for it)
        if w.peer is not None:
            self.by_peer.pop(w.peer, None)
        if self.state == TERMINATE:
            return []  # its tasks were failed by terminate()
        if not (w.stopping or w.dismissed):
            self.lost_workers += 1
            self._unreplaced += 1
            observe.record_lost(self.lost_log, w.id, w.process)
            if self.adaptive and self.target > 0:
                self.target -= 1
        # the running batch's tasks without a result: the first was in progress, the
        # others had not started (the worker runs a batch in order and sends each
        # result as its task finishes); the batch held ahead had not started either
        running = [t for t in w.running() if not t.done]
        first_line = w.order[0] if w.order else None
        later = [t for line, batch in w.held.items() if line != first_line
                 for t in batch.values() if not t.done]
        held = {t.id for t in running} | {t.id for t in later}
        later.extend(self.forget_recalls(w, held))  # asked back, no longer held
        self.batch_first.pop(w.id * 2, None)
        self.batch_first.pop(w.id * 2 + 1, None)
        w.held.clear()
        self.lost[w.id] = {t.id: t for t in running + later}
        while len(self.lost) > LOST_KEPT:
            self.lost.popitem(last=False)
        retry: list[Task] = []
        failed = []
        for task in running[1:]:  # not started, unless results were lost in flight
            task.alone = True  # run alone, so that a start is confirmed
        for task in running[:1]:
            if task.alone and not task.started:
                later.insert(0, task)  # never began: its worker died of something else
                continue
            task.started = False
            task.attempts += 1
            if task.attempts >= self.attempts_limit:
                failed.append(task)
            else:
                retry.extend(self.split(task))
        retry.extend(running[1:])
        if running:
            logger.warning("pool worker %d died holding %d task(s); requeued %d",
                           w.id, len(running) + len(later), len(retry) + len(later))
            logger.debug("pool worker %d was running tasks %s", w.id,
                         [(t.id, t.start, t.attempts) for t in running])
        if self.broken is not None:  # no worker will run them: they fail with the cause
            failed.extend(t for t in retry + later if not t.done)
            retry, later = [], []
        for task in reversed(retry + later):
            self.queue.appendleft(task)
        self.notify()
        self.dispatch_waiting()
        outcomes: list[Outcome] = []
        for task in failed:
            task.done = True
            if self.broken is not None and task.attempts < self.attempts_limit:
                outcomes.append((task, False, self.broken))
                continue
            outcomes.append((task, False, WorkerLostError(
                f"pool task {task.describe()} failed: {task.attempts} worker(s) died "
                "while running it (it may crash or exhaust its worker)")))
        self.failed += len(outcomes)
        observe.record_errors(self.errors, outcomes)
        return outcomes

    def split(self, task: Task) -> list[Task]:
        """A chunk that was running when its worker died runs again item by item."""
        if task.kind == _CALL or task.count == 1:
            task.alone = True
            return [task]
        parts = []
        task.superseded = True
        for offset, item in enumerate(task.payload):
            part = Task(next(self.task_ids), task.fid, task.kind, [item], task.sink,
                        task.start + offset, 1, task.func)
            part.attempts = task.attempts
            part.alone = True
            parts.append(part)
        return parts

    # -- ending ---------------------------------------------------------------------
    def close(self) -> None:
        if self.state == RUN:
            self.state = CLOSE
            self.stop_idle()
            self.notify()

    def terminate(self) -> list[Outcome] | None:
        """Stop handing out; returns the failures of every task not done (None when the
        pool was terminated already)."""
        if self.state == TERMINATE:
            return None
        self.state = TERMINATE
        tasks = list(self.queue)
        self.queue.clear()
        for w in self.workers.values():
            for batch in w.held.values():
                tasks.extend(batch.values())
            tasks.extend(w.recalling.values())
        self.notify()
        error = ValueError("the pool was terminated before this task finished")
        outcomes: list[Outcome] = []
        for task in tasks:
            if not task.done:
                task.done = True
                outcomes.append((task, False, error))
        self.failed += len(outcomes)
        return outcomes

    def break_(self, exc: BaseException) -> list[Outcome]:
        """Workers cannot be started: refuse new work; returns the failures of the
        queued tasks."""
        if self.broken is None:
            self.broken = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
        tasks = list(self.queue)
        self.queue.clear()
        self.notify()
        outcomes: list[Outcome] = []
        for task in tasks:
            if not task.done:
                task.done = True
                outcomes.append((task, False, self.broken))
        self.failed += len(outcomes)
        return outcomes
