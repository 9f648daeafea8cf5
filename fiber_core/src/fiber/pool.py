"""``fiber.Pool``: multiprocessing.Pool's API over job-backed workers.

The master (this process) keeps every task in a *pending table*: queued tasks, and for
each worker the batches it holds. Workers pull batches over the pool's hub channel,
keeping one batch in hand while they run another (see :mod:`fiber.pool_worker`).
When a worker dies (its connection drops, or its job ends), the batches it held go
back to the front of the queue and a replacement worker is started; the batch it was
running is split into single items, so a task that kills every worker it lands on
("poison") fails alone after ``max_task_attempts`` tries with
:class:`fiber.WorkerLostError`. Workers start asynchronously: tasks flow to the first
worker that is up. ``resize(n)`` grows or shrinks a running pool.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from fiber.errors import ProcessStartError, WorkerLostError
from fiber.process import Process
from fiber.runtime import config, run
from fiber.runtime.pool.results import (
    ApplyResult,
    AsyncResult,
    IMapIterator,
    IMapUnorderedIterator,
    MapResult,
)
from fiber.runtime.pool.worker import (
    CALL,
    MAP,
    READY,
    RESULTS,
    STARMAP,
    STARTED,
    STOP,
    TASKS,
    worker,
)
from fiber.wire import serialization, transport
from fiber.wire.protocol import POOL_HEADER as _HEADER

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator",
           "IMapUnorderedIterator"]

logger = logging.getLogger("fiber")

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"
MAX_BATCH = 64
START_FAILURES_LIMIT = 3
_FUNC_CACHE = 256


class _Task:
    __slots__ = ("id", "fid", "kind", "payload", "sink", "start", "count", "attempts",
                 "alone", "done", "superseded", "started", "worker")

    def __init__(self, tid, fid, kind, payload, sink, start, count) -> None:
        self.id = tid
        self.fid = fid
        self.kind = kind
        self.payload = payload
        self.sink = sink
        self.start = start
        self.count = count
        self.attempts = 0
        self.alone = False
        self.done = False  # its outcome was delivered
        self.superseded = False  # split into parts that run instead
        self.started = False  # a worker confirmed it began this (suspect) task
        self.worker: _Worker | None = None  # the worker it was last sent to

    def describe(self) -> str:
        if self.kind == CALL:
            args, kwds = self.payload
            return f"call with args={args!r:.200} kwds={kwds!r:.100}"
        return f"item {self.start} ({self.payload[0]!r:.200})"


class _Worker:
    """The master's mirror of one worker: which of its two lines are parked here,
    which hold a batch, and the order in which the worker waits on them."""

    __slots__ = ("id", "process", "peer", "order", "parked", "held", "funcs",
                 "dispatched", "stopping", "alive", "connected", "listed", "wire")

    def __init__(self, wid: int) -> None:
        self.id = wid
        self.process: Process | None = None
        self.peer: int | None = None
        self.order: collections.deque[int] = collections.deque((0, 1))
        self.parked: dict[int, transport.Request] = {}
        self.held: dict[int, list[_Task]] = {}
        self.funcs: set[int] = set()
        self.dispatched = 0
        self.stopping = False
        self.alive = True
        self.connected = False
        self.listed = False  # in the pool's idle or spare list
        self.wire = None  # a request it sent: its connection, for reading directly

    @property
    def busy(self) -> bool:
        return bool(self.held)

    def free_line(self) -> int | None:
        """The line to answer next: the first in the worker's waiting order that is
        parked here, provided every line before it already holds a batch."""
        for line in self.order:
            if line in self.parked:
                return line
            if line not in self.held:
                return None
        return None

    def running(self) -> list[_Task]:
        """The batch the worker is running (the first line in its order, if it holds
        one)."""
        return self.held.get(self.order[0], []) if self.order else []


def _wait_directly(task: _Task, result: ApplyResult, timeout: float | None) -> None:
    """Wait for ``result`` by reading its worker's connection on this thread (see
    :meth:`fiber.stream.StreamListener.read_directly`); returns early, leaving the
    caller to wait as usual, when the task is not with a worker or moves to another."""
    w = task.worker
    read_until = getattr(w.wire, "read_until", None) if w is not None else None
    if read_until is None or not w.alive:
        return
    read_until(lambda: result._ready or task.worker is not w or not w.alive, timeout)


class _PoolChannel:
    """Hub channel of one pool; forwards to the pool while it exists."""

    def __init__(self, pool: Pool) -> None:
        self._pool = weakref.ref(pool)

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        pool = self._pool()
        if pool is None:
            request.reply(STOP)
            return
        pool._handle(request, payload)

    def peer_gone(self, peer: int) -> None:
        pool = self._pool()
        if pool is not None:
            pool._peer_gone(peer)


class Pool:
    """A pool of job-backed worker processes, as :class:`multiprocessing.pool.Pool`.

    fiber extensions (keyword-only): ``min_processes``/``max_processes`` bound
    :meth:`resize`; ``max_task_attempts`` (default: the ``max_task_attempts``
    setting, 3) is how many workers a task may lose before it fails.
    """

    _wrap_exception = True

    def __init__(self, processes: int | None = None, initializer: Callable | None = None,
                 initargs: Iterable = (), maxtasksperchild: int | None = None,
                 context=None, *, min_processes: int | None = None,
                 max_processes: int | None = None, max_task_attempts: int | None = None):
        # raise here, not in the threads that start the workers (see Process.start)
        run.check_not_importing_main()
        if processes is None:
            processes = os.cpu_count() or 1
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self._min = min_processes or 1
        self._max = max_processes
        self._check_size(processes)
        self._attempts_limit = max_task_attempts or config.get_config().max_task_attempts
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._maxtasks = maxtasksperchild
        self._state = RUN
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._queue: collections.deque[_Task] = collections.deque()
        # workers with a parked line: with nothing to do, and busy ones (prefetch)
        self._idle: collections.deque[_Worker] = collections.deque()
        self._spare: collections.deque[_Worker] = collections.deque()
        self._workers: dict[int, _Worker] = {}
        self._processes: list[Process] = []  # every worker started, until joined
        self._by_peer: dict[int, _Worker] = {}
        self._target = processes
        self._starting = 0  # workers asked for that have not connected yet
        self._task_ids = itertools.count()
        self._worker_ids = itertools.count(1)
        self._func_ids = itertools.count()
        self._funcs: collections.OrderedDict[int, tuple[object, int, bytes]] = \
            collections.OrderedDict()
        self._func_bytes: dict[int, bytes] = {}
        self._start_failures = 0
        # tasks held by recently lost workers: their results may still be in flight
        self._lost: collections.OrderedDict[int, dict[int, _Task]] = collections.OrderedDict()
        self._broken: BaseException | None = None
        self._hub = run.hub()
        self._cid = self._hub.add_channel(_PoolChannel(self), stream=True)
        self._address = self._hub.stream_address
        # validate what every worker will receive, once, before starting any
        serialization.dumps_code((initializer, self._initargs))
        self._starter = ThreadPoolExecutor(max_workers=8, thread_name_prefix="fiber-pool-start")
        self._supervisor = threading.Thread(target=Pool._supervise, daemon=True,
                                            args=(weakref.ref(self), self._changed),
                                            name="fiber-pool-supervisor")
        self._supervisor.start()
        self._finalizer = weakref.finalize(self, Pool._terminate_workers,
                                           self._processes, self._hub, self._cid)

    # -- size -----------------------------------------------------------------------
    def _check_size(self, n: int) -> None:
        if n < self._min or (self._max is not None and n > self._max):
            raise ValueError(f"pool size {n} is outside its bounds "
                             f"[{self._min}, {self._max or 'unbounded'}]")

    @property
    def processes(self) -> int:
        """fiber extension: the number of workers the pool aims to have."""
        return self._target

    def resize(self, processes: int) -> None:
        """fiber extension: grow or shrink the pool while it runs. A worker that is let
        go finishes the tasks it holds first."""
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        self._check_size(processes)
        with self._lock:
            self._check_running()
            self._target = processes
            live = [w for w in self._workers.values() if w.alive and not w.stopping]
            extra = len(live) - processes
            if extra > 0:
                live.sort(key=lambda w: (w.busy, w.connected))  # idle/unstarted first
                for w in live[:extra]:
                    self._retire(w)
            self._changed.notify_all()

    def _retire(self, w: _Worker) -> None:
        w.stopping = True
        if not w.busy:
            self._stop_lines(w)
        if not w.connected and w.process is not None:
            try:
                w.process.terminate()
            except Exception:  # noqa: BLE001 - the job may already be gone
                logger.debug("terminating unstarted worker failed", exc_info=True)

    # -- workers --------------------------------------------------------------------
    @staticmethod
    def _supervise(ref: weakref.ref, changed: threading.Condition) -> None:
        """Keep the pool at its size. Holds the pool only weakly between rounds, so an
        unreferenced pool can be garbage collected (which ends its workers)."""
        while True:
            pool = ref()
            if pool is None:
                return
            with changed:
                plan = pool._plan_workers()
                if plan is None:
                    return
                if not plan:
                    del pool
                    changed.wait(1.0)
                    continue
            for w in plan:
                try:
                    pool._starter.submit(pool._start_worker, w)
                except RuntimeError:  # terminated meanwhile
                    return
            del pool

    def _plan_workers(self) -> list[_Worker] | None:
        """Workers to start now ([] for none), or None when supervising is over.
        Called with the lock held."""
        if self._state == TERMINATE:
            return None
        live = sum(1 for w in self._workers.values() if w.alive and not w.stopping)
        need = self._target - live
        if self._state == CLOSE and not self._unfinished():
            if not any(w.alive for w in self._workers.values()):
                return None
            need = 0
        if need <= 0 or self._broken is not None:
            return []
        new = [_Worker(next(self._worker_ids)) for _ in range(need)]
        for w in new:
            self._workers[w.id] = w
        self._starting += len(new)
        return new

    def _start_worker(self, w: _Worker) -> None:
        process = Process(target=worker, name=f"PoolWorker-{w.id}", daemon=True,
                          args=(self._address, self._cid, w.id, self._initializer,
                                self._initargs))
        try:
            process.start()
        except Exception as exc:  # noqa: BLE001 - the pool reports it through results
            logger.error("cannot start a pool worker: %s", exc)
            self._break(exc)
            with self._lock:
                if w.alive:
                    w.alive = False
                    self._starting -= 1
                self._workers.pop(w.id, None)
            return
        w.process = process
        with self._lock:
            self._processes[:] = [p for p in self._processes if p.exitcode is None]
            self._processes.append(process)
            late = self._state == TERMINATE
        if late:
            # terminate() ended the workers it knew of while this one was starting
            Pool._terminate_workers([process], None, self._cid)
            return
        ref = weakref.ref(self)

        def ended() -> None:
            pool = ref()
            if pool is not None:
                pool._worker_ended(w)

        process._popen.add_done_callback(ended)

    def _worker_ended(self, w: _Worker) -> None:
        popen = w.process._popen if w.process is not None else None
        if popen is not None and not w.connected and not w.stopping \
                and self._state != TERMINATE:
            with self._lock:
                self._start_failures += 1
                failures = self._start_failures
            if failures >= START_FAILURES_LIMIT:
                self._break(popen.start_error or ProcessStartError(
                    f"{failures} pool workers in a row exited (last exit code "
                    f"{popen.returncode}) before they could take tasks; see their output "
                    "above"))
        self._lose(w)

    def _break(self, exc: BaseException) -> None:
        """Workers cannot be started: fail everything waiting, refuse new work."""
        with self._lock:
            if self._broken is None:
                self._broken = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
            tasks = list(self._queue)
            self._queue.clear()
            self._changed.notify_all()
        for task in tasks:
            task.sink._set(task.start, task.count, False, self._broken)

    def _lose(self, w: _Worker) -> None:
        """A worker is gone: put its tasks back, fail the ones out of attempts."""
        failed = []
        with self._lock:
            if not w.alive:
                return
            w.alive = False
            if not w.connected:
                self._starting -= 1
            self._workers.pop(w.id, None)
            if w.peer is not None:
                self._by_peer.pop(w.peer, None)
            if self._state == TERMINATE:
                return  # its tasks were failed by terminate()
            first = w.running()
            running = [t for t in first if not t.done]
            later = [t for batch in w.held.values() if batch is not first
                     for t in batch if not t.done]
            w.held.clear()
            self._lost[w.id] = {t.id: t for t in running + later}
            while len(self._lost) > 64:
                self._lost.popitem(last=False)
            retry = []
            for task in running:
                if task.alone and not task.started:
                    later.insert(0, task)  # never began: its worker died of something else
                    continue
                task.started = False
                task.attempts += 1
                if task.attempts >= self._attempts_limit:
                    failed.append(task)
                else:
                    retry.extend(self._split(task))
            if running:
                logger.warning("pool worker %d died holding %d task(s); requeued %d",
                               w.id, len(running) + len(later), len(retry) + len(later))
                logger.debug("pool worker %d was running tasks %s", w.id,
                             [(t.id, t.start, t.attempts) for t in running])
            for task in reversed(retry + later):
                self._queue.appendleft(task)
            self._changed.notify_all()
            self._dispatch_waiting()
        for task in failed:
            task.done = True
            error = WorkerLostError(
                f"pool task {task.describe()} failed: {task.attempts} worker(s) died "
                "while running it (it may crash or exhaust its worker)")
            task.sink._set(task.start, task.count, False, error)

    def _split(self, task: _Task) -> list[_Task]:
        """A chunk that was running when its worker died runs again item by item."""
        if task.kind == CALL or task.count == 1:
            task.alone = True
            return [task]
        parts = []
        task.superseded = True
        for offset, item in enumerate(task.payload):
            part = _Task(next(self._task_ids), task.fid, task.kind, [item], task.sink,
                         task.start + offset, 1)
            part.attempts = task.attempts
            part.alone = True
            parts.append(part)
        return parts

    def _peer_gone(self, peer: int) -> None:
        with self._lock:
            w = self._by_peer.get(peer)
        if w is not None:
            self._lose(w)

    # -- the channel (hub thread) ---------------------------------------------------
    def _handle(self, request: transport.Request, payload: memoryview) -> None:
        op = bytes(payload[:1])
        wid, line = _HEADER.unpack_from(payload, 1)
        body = payload[1 + _HEADER.size:]
        done: list[tuple[_Task, bool, object]] = []
        with self._lock:
            w = self._workers.get(wid)
            if w is None or not w.alive or line not in (0, 1):
                lost = self._lost.get(wid)
                if op == RESULTS and lost:
                    # results that were on their way when the worker was given up
                    for tid, ok, value in serialization.loads(body):
                        task = lost.pop(tid, None)
                        if task is not None and not task.done and not task.superseded:
                            task.done = True
                            done.append((task, ok, value))
                request.reply(STOP)
                w = None
        if w is None:
            self._deliver(done)
            return
        with self._lock:
            if op == READY:
                if not w.connected:
                    w.connected = True
                    self._starting -= 1
                    w.peer = request.peer
                    self._by_peer[request.peer] = w
                    self._start_failures = 0
            elif op == STARTED:
                for task in w.held.get(line, []):
                    task.started = True
                request.reply(b"")
                return
            elif op == RESULTS:
                batch = {t.id: t for t in w.held.pop(line, [])}
                for tid, ok, value in serialization.loads(body):
                    task = batch.pop(tid, None)
                    if task is not None and not task.done:
                        task.done = True
                        done.append((task, ok, value))
                if w.order and w.order[0] == line:
                    w.order.rotate(-1)  # the worker now waits on its other line
            else:
                request.reply(b"unknown pool request", transport.ERROR)
                return
            w.parked[line] = request
            w.wire = request
            self._offer(w)
            if self._state == CLOSE and not self._unfinished():
                self._changed.notify_all()
        self._deliver(done)

    @staticmethod
    def _deliver(done: list) -> None:
        for task, ok, value in done:
            if not ok:
                value = serialization.unpack_exception(value)
            try:
                task.sink._set(task.start, task.count, ok, value)
            except Exception:  # noqa: BLE001 - a user's callback must not stop the pool
                logger.exception("a callback of pool task %s raised", task.describe())

    def _unfinished(self) -> bool:
        return bool(self._queue) or any(w.busy for w in self._workers.values())

    def _offer(self, w: _Worker) -> None:
        """A worker has a parked line: give it work, keep it, or stop it."""
        if w.stopping or (self._maxtasks is not None and w.dispatched >= self._maxtasks):
            w.stopping = True
            if not w.busy:
                self._stop_lines(w)
                self._changed.notify_all()
            if self._state != RUN:
                self._stop_idle()  # this may have been the last result of a closed pool
            return
        while self._queue:
            line = w.free_line()
            if line is None or (w.busy and not self._may_prefetch()) \
                    or not self._send_batch(w, line):
                break
        if self._state != RUN and not self._unfinished():
            self._stop_lines(w)  # also a line that arrived after the others were stopped
            self._stop_idle()
            return
        if w.free_line() is None:
            return
        if not w.listed:
            w.listed = True
            (self._spare if w.busy else self._idle).append(w)
        if self._state != RUN:
            self._stop_idle()

    def _stop_lines(self, w: _Worker) -> None:
        parked, w.parked = w.parked, {}
        for request in parked.values():
            request.reply(STOP)

    def _stop_idle(self) -> None:
        if self._unfinished():
            return
        for w in list(self._workers.values()):
            if not w.busy:
                self._stop_lines(w)

    def _send_batch(self, w: _Worker, line: int) -> bool:
        """Answer the worker's parked ``line`` with a batch from the queue; False when
        there was nothing to send."""
        while self._queue and self._queue[0].done:
            self._queue.popleft()  # delivered late by a lost worker
        if not self._queue:
            return False
        # size batches by the pool's target size, not by the workers up so far: the
        # first workers to connect must not take the work of those still starting
        alive = max(1, self._target,
                    sum(1 for x in self._workers.values() if x.connected and x.alive))
        first = self._queue.popleft()
        batch = [first]
        if not first.alone and first.count == 1:  # chunks are batches already
            size = min(MAX_BATCH, len(self._queue) // (2 * alive))
            if self._maxtasks is not None:
                size = min(size, self._maxtasks - w.dispatched - 1)
            while size > 0 and self._queue and not self._queue[0].alone \
                    and self._queue[0].count == 1:
                task = self._queue.popleft()
                if not task.done:
                    batch.append(task)
                    size -= 1
        wire = []
        for task in batch:
            if task.fid in w.funcs:
                code = None
            else:
                code = self._func_bytes[task.fid]
                w.funcs.add(task.fid)
            wire.append((task.id, task.fid, code, task.kind, task.payload))
        try:
            data = serialization.dumps((first.alone, wire))
        except Exception as exc:  # noqa: BLE001 - an argument cannot be pickled
            for task in batch:
                task.done = True
                task.sink._set(task.start, task.count, False, exc)
            return True
        request = w.parked.pop(line)
        w.held[line] = batch
        for task in batch:
            task.worker = w
        w.dispatched += len(batch)
        if not request.reply(TASKS + data):
            del w.held[line]  # the worker is gone; _lose will not see this batch
            w.dispatched -= len(batch)
            for task in reversed(batch):
                task.worker = None
                self._queue.appendleft(task)
            return False
        return True

    def _dispatch_waiting(self) -> None:
        """Queued tasks and parked lines: hand them out, idle workers first."""
        while self._queue:
            w = self._next_worker()
            if w is None:
                return
            self._send_batch(w, w.free_line())
            if w.free_line() is not None and not w.listed:
                w.listed = True
                (self._spare if w.busy else self._idle).append(w)

    def _may_prefetch(self) -> bool:
        """Whether a busy worker may take a batch in advance: only when the queue holds
        more than the workers still starting will take (so the first workers up do not
        take the first tasks of the others)."""
        return len(self._queue) > self._starting

    def _next_worker(self) -> _Worker | None:
        """A worker with a line to answer: one with nothing to do, else a busy one."""
        for listing in (self._idle, self._spare):
            if listing is self._spare and not self._may_prefetch():
                return None
            while listing:
                w = listing.popleft()
                w.listed = False
                if w.alive and not w.stopping and w.free_line() is not None:
                    return w
        return None

    # -- submitting -----------------------------------------------------------------
    def _check_running(self) -> None:
        if self._state != RUN:
            raise ValueError("Pool not running")
        if self._broken is not None:
            raise self._broken

    def _func_id(self, func) -> int:
        key = id(func)
        entry = self._funcs.get(key)
        if entry is not None and entry[0] is func:
            self._funcs.move_to_end(key)
            return entry[1]
        code = serialization.dumps_code(func)
        fid = next(self._func_ids)
        self._funcs[key] = (func, fid, code)
        self._func_bytes[fid] = code
        if len(self._funcs) > _FUNC_CACHE:
            _, (_, old, _) = self._funcs.popitem(last=False)
            self._func_bytes.pop(old, None)  # workers that have it keep it
        return fid

    def _submit(self, tasks: list[_Task]) -> None:
        with self._lock:
            self._check_running()
            self._queue.extend(tasks)
            self._dispatch_waiting()

    def _chunks(self, func, iterable, chunksize, kind, sink_factory):
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._target * 4)
            if extra:
                chunksize += 1
        chunksize = max(1, int(chunksize))
        sink = sink_factory(len(items))
        with self._lock:
            self._check_running()
            fid = self._func_id(func)
            tasks = [_Task(next(self._task_ids), fid, kind, items[i:i + chunksize], sink, i,
                           len(items[i:i + chunksize]))
                     for i in range(0, len(items), chunksize)]
        self._submit(tasks)
        return sink

    def apply(self, func, args=(), kwds=None):
        """``func(*args, **kwds)`` in a worker; waits for the result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func, args=(), kwds=None, callback=None, error_callback=None):
        result = ApplyResult(callback, error_callback)
        with self._lock:
            self._check_running()
            fid = self._func_id(func)
            task = _Task(next(self._task_ids), fid, CALL, (tuple(args), dict(kwds or {})),
                         result, 0, 1)
            self._queue.append(task)
            self._dispatch_waiting()
        result._direct = functools.partial(_wait_directly, task, result)
        return result

    def map(self, func, iterable, chunksize=None):
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func, iterable, chunksize=None, callback=None, error_callback=None):
        return self._chunks(func, iterable, chunksize, MAP,
                            lambda n: MapResult(n, callback, error_callback))

    def starmap(self, func, iterable, chunksize=None):
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func, iterable, chunksize=None, callback=None,
                      error_callback=None):
        return self._chunks(func, [tuple(x) for x in iterable], chunksize, STARMAP,
                            lambda n: MapResult(n, callback, error_callback))

    def imap(self, func, iterable, chunksize=1):
        """Results in input order as they arrive (the iterable is read at once)."""
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        return self._chunks(func, iterable, chunksize, MAP, IMapIterator)

    def imap_unordered(self, func, iterable, chunksize=1):
        """Results in the order they finish (the iterable is read at once)."""
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        return self._chunks(func, iterable, chunksize, MAP, IMapUnorderedIterator)

    # -- ending ---------------------------------------------------------------------
    def close(self) -> None:
        """No more tasks; workers exit once every submitted task is done."""
        with self._lock:
            if self._state == RUN:
                self._state = CLOSE
                self._stop_idle()
                self._changed.notify_all()

    def terminate(self) -> None:
        """Stop the workers now; results still pending fail."""
        with self._lock:
            if self._state == TERMINATE:
                return
            self._state = TERMINATE
            tasks = list(self._queue)
            self._queue.clear()
            for w in self._workers.values():
                for batch in w.held.values():
                    tasks.extend(batch)
            self._changed.notify_all()
        error = ValueError("the pool was terminated before this task finished")
        for task in tasks:
            task.done = True
            task.sink._set(task.start, task.count, False, error)
        self._finalizer()
        # as multiprocessing's terminate() joins its workers: a worker whose start was
        # under way is ended by _start_worker before this returns
        self._starter.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _terminate_workers(processes: list, hub: transport.Hub | None, cid: int) -> None:
        if hub is not None:
            hub.remove_channel(cid)
        processes = list(processes)
        for p in processes:
            try:
                p.terminate()
            except Exception:  # noqa: BLE001 - already gone
                pass
        for p in processes:
            try:
                p.join(5)
                if p.exitcode is None:
                    p.kill()
                    p.join(5)
            except Exception:  # noqa: BLE001 - a worker that never started
                pass

    def join(self) -> None:
        """Wait for the workers to exit (after close() or terminate())."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        closing = self._state == CLOSE
        if closing:
            self._supervisor.join()
        # after this, every worker asked for is in _processes; terminate() has already
        # ended (with bounded waits) those it knew of and the ones still starting
        self._starter.shutdown(wait=True)
        if not closing:
            return
        with self._lock:
            processes = list(self._processes)
        for p in processes:
            try:
                p.join()
            except ProcessStartError:
                pass
        self._finalizer()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f"<fiber.Pool state={self._state} pool_size={self._target}>"

    def __reduce__(self):
        raise NotImplementedError(
            "pool objects cannot be passed between processes or pickled")
