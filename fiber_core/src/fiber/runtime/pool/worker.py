"""The loop a Pool worker runs in its job.

It keeps two request lines (0 and 1) open on the pool's channel and waits on them in
strict alternation, so that while it runs one batch of tasks the next batch is already
on its way. A batch is a unit of sending, not of reporting: while the batch runs, each
task's result goes back as the task finishes (``PARTIAL``, one-way, from the worker's
:class:`ResultSender` thread), and the request that reopens the line carries the
results not sent yet (at least the batch's last one). So a worker that dies loses only
its task in progress (and those it had not started), never one it finished. The
master mirrors the alternation, so it always knows which batch is running (the nng
wire does not promise that two lines' requests arrive in the order they were sent;
the stream wire the pool uses does, and the mirror costs nothing). A ``STOP`` answer
retires a line; the worker exits when both are retired (pool closed, shrunk, or
``maxtasksperchild`` reached). A batch of *suspect* tasks (ones that were running when
a worker died) comes flagged: the worker confirms on a third line that it starts it,
so that only a real start counts as an attempt.

The master may take back tasks it sent but the worker has not started (so that a worker
that comes up late, or one that ran out of work at a map's tail, gets them): a fourth
line, the *give line*, is open for that (``GIVE``, served by the worker's
:class:`~fiber.runtime.pool.giver.Giver` thread) while the master wants it: a batch
flagged ``OPEN_GIVE`` (the worker's first) opens it, a ``STOP`` answer closes it. It goes over the job's own
connection to the parent, not the worker's: a thread waiting on the worker's
connection would be the one to read every batch and hand it over, a wake-up per message
that a thousand workers on two cores feel; on the job's connection, whose heartbeat
thread reads it anyway, the Giver thread wakes only for a recall, and is started only
by the first (until then the heartbeat thread hands the line's replies to it).
A ``RECALL`` answer names a line, the number of the batch on that line, and task ids;
the worker gives back those it has not started (it will skip them) and says which in
its next ``GIVE``, so a task is run by one worker only.
"""

from __future__ import annotations

import _thread
import collections
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fiber import threads
from fiber.errors import ConnectionLostError, FiberThreadError
from fiber.runtime import config
from fiber.runtime.pool.giver import Giver, guard
from fiber.runtime.pool.result_codec import encode
from fiber.wire import serialization, transport
from fiber.wire.framing import request_frame
from fiber.wire.protocol import BATCH_TIME, CONNECT_TIMEOUT, BatchFlag, PoolOp, TaskKind
from fiber.wire.protocol import POOL_HEADER as _HEADER

logger = logging.getLogger(__name__)

READY = PoolOp.READY
RESULTS = PoolOp.RESULTS
PARTIAL = PoolOp.PARTIAL
STARTED = PoolOp.STARTED
GIVE = PoolOp.GIVE
STOP = PoolOp.STOP
TASKS = PoolOp.TASKS
CALL, MAP, STARMAP = TaskKind.CALL, TaskKind.MAP, TaskKind.STARMAP
# a batch's flags (True is a suspect batch, False a plain one)
SUSPECT, OPEN_GIVE, KEPT = BatchFlag.SUSPECT, BatchFlag.OPEN_GIVE, BatchFlag.KEPT


_clock = time.perf_counter
#: a task that ran longer (seconds) has its result sent by the main thread itself
DIRECT_AFTER = 0.0005

# [(task_id, func_id, func_bytes or None when the worker has it, kind, payload), ...]
Batch = Sequence[tuple[int, int, bytes | None, int, Any]]


def load_functions(batch: Batch, funcs: dict[int, Any]) -> None:
    """Unpickle the functions a batch brings (this may import their modules)."""
    for _, func_id, func_bytes, _, _ in batch:
        if func_bytes is not None and func_id not in funcs:
            funcs[func_id] = serialization.loads_code(func_bytes)


def run_batch(batch: Batch, funcs: dict[int, Any],
              sender: ResultSender | None = None,
              giver: Giver | None = None) -> list[tuple[int, bool, Any]]:
    """Run ``[(task_id, func_id, func_bytes, kind, payload), ...]`` in order, their
    functions loaded into ``funcs`` already (:func:`load_functions`: the worker loads
    them before it starts its clock); returns ``[(task_id, ok, value), ...]`` where a
    failure's value is a packed exception. With a ``sender``, every result but the last
    is handed to it as its task finishes, and the list holds the last one only. With a
    ``giver``, a task it gave back is skipped (it has no result here)."""
    results: list[tuple[int, bool, Any]] = []
    last = len(batch) - 1
    early = sender if sender is not None and last > 0 else None
    for index, (task_id, func_id, _, kind, payload) in enumerate(batch):
        if giver is not None and not giver.begin(task_id):
            continue  # given back: another worker runs it
        func = funcs[func_id]
        began = 0.0 if early is None else _clock()
        try:
            if giver is not None and giver.error is not None:
                raise giver.error  # its thread died: the task fails with the cause
            if kind == CALL:
                args, kwds = payload
                value = func(*args, **kwds)
            elif kind == MAP:
                value = [func(x) for x in payload]
            else:
                value = [func(*x) for x in payload]
            result = (task_id, True, value)
        except BaseException as exc:  # noqa: BLE001 - every task failure goes back
            result = (task_id, False, serialization.pack_exception(exc))
        if early is None or index == last:
            results.append(result)
        elif early.idle and not early.pending and _clock() - began > DIRECT_AFTER:
            early.send_now(result)  # a long task: no hand-off to the thread
        else:
            early.pending.append(result)  # inline add(): a task costs a microsecond
            if early.idle:
                early.wake()
    return results


def encode_results(worker_id: int, line: int, results: list[tuple[int, bool, Any]],
                   op: bytes = RESULTS, busy: float = 0.0, ran: int = 0) -> bytes:
    """A ``RESULTS`` (or ``PARTIAL``) message; a result that cannot be pickled fails
    its own task (see :mod:`~fiber.runtime.pool.result_codec`). A ``RESULTS`` message
    says how long the batch's ``ran`` tasks took, ``busy`` seconds (:data:`BATCH_TIME`)."""
    head = op + _HEADER.pack(worker_id, line)
    if op == RESULTS:
        head += BATCH_TIME.pack(busy, ran)
    return encode(results, head)


class ResultSender:
    """Sends the results of a batch's tasks as they finish, from a thread of its own,
    while the worker's main thread runs the next task.

    One ``PARTIAL`` message carries whatever results accumulated while the previous
    one was being written: there is no timer and no added delay, and tasks that take
    microseconds share a message instead of costing one each. :meth:`finish` takes the
    results not sent yet for the request that reopens the line; it waits for a message
    being written, so the master always reads a batch's partial results before that
    request. The thread is started for the first batch of more than one task (a pool
    of ``apply`` calls never needs it). If it dies (a bug of fiber's, see
    :mod:`fiber.threads`), the tasks of the running batch whose results it had not sent
    fail with the :class:`~fiber.errors.FiberThreadError` naming it, so the waiting
    ``map`` or ``get`` raises it; the worker goes on, its next batches' results going
    with their lines' requests."""

    def __init__(self, client: Any, cid: int, worker_id: int) -> None:
        self._ctx = client.context()
        self._ctx.close()  # one-way: no reply comes, and any would be dropped
        # (the stream wire's: reads what has arrived, see StreamClient.drain)
        self._drain: Callable[[], None] = getattr(client, "drain", lambda: None)
        self._cid = cid
        self._worker_id = worker_id
        self.line = 0  # the line whose batch runs; set between batches
        self.pending: collections.deque[tuple[int, bool, Any]] = collections.deque()
        self._lock = threading.Lock()  # held while results are taken and written
        self._wake = _thread.allocate_lock()
        self._wake.acquire()  # released to wake the thread
        self.idle = False
        self._closed = False
        self._held: list[tuple[int, bool, Any]] = []  # taken by the thread, not sent yet
        #: why the thread died (then :meth:`finish` fails the batch's unsent results)
        self.error: FiberThreadError | None = None
        # set once the thread runs its loop or has died: the first finish() waits for
        # it, so a thread that dies as it starts fails the first batch, not a later one
        self._up = threading.Event()
        self._thread = threads.start("fiber-pool-results", self._run, fails=self._died)

    def add(self, result: tuple[int, bool, Any]) -> None:
        """A task of the running batch finished (main thread; :func:`run_batch` does
        the same inline)."""
        self.pending.append(result)
        if self.idle:
            self.wake()

    def send_now(self, result: tuple[int, bool, Any]) -> None:
        """Send one result from the main thread, the thread being idle with nothing
        pending (after a long task: a hand-off would cost more than the send)."""
        with self._lock:
            self._send([result])

    def _send(self, results: list[tuple[int, bool, Any]]) -> bool:
        """Write one PARTIAL message (holding the lock); False: the connection is lost."""
        try:
            self._ctx.send(self._cid, encode_results(self._worker_id, self.line, results,
                                                     PARTIAL))
        except ConnectionLostError as exc:
            # the main thread finds out too, when it waits for its next batch
            logger.debug("pool worker %d stops sending results: %s", self._worker_id, exc)
            return False
        # the next batch, if it came, leaves the kernel's queue (a kill then closes the
        # connection in order: what was sent is not thrown away)
        self._drain()
        return True

    def wake(self) -> None:
        """Wake the thread to send what is pending (main thread)."""
        self.idle = False
        try:
            self._wake.release()
        except RuntimeError:
            pass  # released already: the thread is awake

    def finish(self, last: list[tuple[int, bool, Any]]) -> list[tuple[int, bool, Any]]:
        """The batch is done: its results not sent yet, ``last`` included (main
        thread). If the thread died, each of them is a failure with its
        :class:`~fiber.errors.FiberThreadError` instead: the tasks whose results went
        through the dead thread fail with the cause, which the waiting call raises."""
        with self._lock:
            if not self._up.is_set():
                self._up.wait()
            rest = self._held + list(self.pending)
            self._held = []
            self.pending.clear()
        rest.extend(last)
        error = self.error
        if error is None:
            return rest
        packed = serialization.pack_exception(error)
        return [(task_id, False, packed) for task_id, _, _ in rest]

    def _died(self, error: FiberThreadError) -> None:
        """The thread died (in it): the main thread fails the batch's unsent results
        (:meth:`finish`) and runs the next batches without a sender."""
        self.error = error
        self.idle = False  # (nothing hands a result to a dead thread)
        self._up.set()

    def close(self) -> None:
        self._closed = True
        try:
            self._wake.release()
        except RuntimeError:
            pass

    def _run(self) -> None:
        pending = self.pending
        self._up.set()
        while not self._closed:
            self.idle = True
            if not pending:
                self._wake.acquire()
            self.idle = False
            with self._lock:
                if not pending or self._closed:
                    continue
                results = self._held  # (what the thread holds if it dies)
                while pending:
                    results.append(pending.popleft())
                sent = self._send(results)
                self._held = []
                del results  # (sent: not kept while the thread waits)
                if not sent:
                    return


def worker(address: str, cid: int, worker_id: int,
           initializer: Callable[..., object] | None = None,
           initargs: Sequence[Any] = ()) -> None:
    if initializer is not None:
        serialization.rebind_main(initializer)(*initargs)
    # a connection of its own, not the job's (whose heartbeat thread is nearly always
    # the one reading it, so every batch would reach this thread through that one);
    # its connect waits out an outage of the path to the parent as long as the job's
    # connection, already made, rides one out (heartbeat_timeout)
    client = transport.StreamClient(
        address, connect_timeout=max(CONNECT_TIMEOUT, config.get_config().heartbeat_timeout))
    funcs: dict[int, object] = {}
    confirm = client.context()
    sender: ResultSender | None = None
    sender_died = False
    lines: collections.deque[tuple[int, Any]] = collections.deque()
    heads = [request_frame(cid, RESULTS + _HEADER.pack(worker_id, line)) for line in (0, 1)]
    for line in (0, 1):
        ctx = client.context()
        ctx.send(cid, READY + _HEADER.pack(worker_id, line))
        lines.append((line, ctx))
    # the give line on the job's own connection (the parent's, shared, whose heartbeat
    # thread reads it): a batch for this worker never wakes the Giver thread
    giver = Giver(transport.get_client(address), cid, worker_id)
    try:
        while lines:
            line, ctx = lines.popleft()
            try:
                reply = ctx.recv()
            except ConnectionLostError as exc:
                # the pool was terminated or collected (or its program ended): nothing
                # is left to do, as a multiprocessing worker exits when its queue is gone
                logger.debug("pool worker %d exits: %s", worker_id, exc)
                return
            if reply[:1] == STOP:
                ctx.close()
                continue
            message = serialization.loads(memoryview(reply)[1:])
            flags, batch = message[0], message[1]
            if len(message) > 2:  # functions the parent freed: never sent again
                for func_id in message[2]:
                    funcs.pop(func_id, None)
            if flags & OPEN_GIVE:
                giver.open()
            if flags & SUSPECT:
                load_functions(batch, funcs)  # slow imports are not the task's fault
                confirm.request(cid, STARTED + _HEADER.pack(worker_id, line))
            giver.line = line
            load_functions(batch, funcs)  # (importing a function is not the tasks' time)
            began = _clock()
            if len(batch) > 1 and not sender_died:
                if sender is None:
                    sender = ResultSender(client, cid, worker_id)
                sender.line = line
                results = sender.finish(run_batch(batch, funcs, sender, giver))
                # its thread died: this batch's unsent results failed with the cause;
                # the next batches' results go with their lines' requests
                sender_died = sender.error is not None
            else:
                results = run_batch(batch, funcs, None, guard(flags, giver))
            busy = _clock() - began
            ran = len(batch) - giver.end_batch()
            # one concatenation: the request's head (channel, op, worker, line) is made
            # once per line
            ctx.send_request(encode(results, heads[line] + BATCH_TIME.pack(busy, ran)))
            lines.append((line, ctx))
            # as multiprocessing's worker drops its task and result: nothing of this
            # batch (arguments, results) is kept while the worker waits for the next
            del message, batch, results
    finally:
        if sender is not None:
            sender.close()
        client.close()


def worker_group(address: str, cid: int, worker_ids: Sequence[int],
                 initializer: Callable[..., object] | None = None,
                 initargs: Sequence[Any] = ()) -> None:
    """Run one pool worker per id of ``worker_ids`` in this job (the pool's
    ``workers_per_job``): each in a child forked from the job (the standard library's
    ``fork`` start method, so each has its own interpreter and connection to the pool,
    as a worker of a job of its own), and wait for them all. A child that is lost is
    lost to the pool alone (its connection drops) and replaced by the pool; its siblings
    go on. The job ends when every child has ended: with the first child's failure
    (the same exit status, or the same signal) if one failed, so the pool reads the
    job's end as it reads a single worker's."""
    import multiprocessing  # lazy: only jobs that run several workers fork
    from multiprocessing.connection import wait

    fork = multiprocessing.get_context("fork")
    parent = os.getpid()
    children = [fork.Process(target=_group_member, name=f"PoolWorker-{wid}",
                             args=(parent, address, cid, wid, initializer, initargs))
                for wid in worker_ids]
    for child in children:
        child.start()
    failure = 0
    waiting: dict[Any, Any] = {child.sentinel: child for child in children}
    try:
        while waiting:
            for sentinel in wait(list(waiting)):
                child = waiting.pop(sentinel)
                child.join()
                code = child.exitcode or 0
                if code and not failure:
                    failure = code
                    logger.debug("pool worker %s of this job ended with %s", child.name,
                                 code)
    finally:
        for child in children:  # this job is being ended: so are its workers
            if child.exitcode is None:
                child.kill()
                child.join()
    if failure < 0:  # as the child ended: the job's end reads as that worker's
        signal.signal(-failure, signal.SIG_DFL)
        os.kill(os.getpid(), -failure)
    if failure:
        raise SystemExit(failure)


def _group_member(parent: int, address: str, cid: int, worker_id: int,
                  initializer: Callable[..., object] | None,
                  initargs: Sequence[Any]) -> None:
    """A worker of a :func:`worker_group`: it ends with its job's process, however that
    ends (Linux's parent-death signal: a job killed by its cluster takes its workers)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the cluster ends the job's processes
        logger.debug("no parent-death signal here", exc_info=True)
    if os.getppid() != parent:  # the job ended before the signal was set
        os._exit(1)
    worker(address, cid, worker_id, initializer, initargs)
