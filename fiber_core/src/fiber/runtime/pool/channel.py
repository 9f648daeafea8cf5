"""The pool's channel on the hub: decodes what workers send and hands it to the pending
table (:mod:`~fiber.runtime.pool.scheduler`).

Each request is a :class:`~fiber.wire.protocol.PoolOp` code and
:data:`~fiber.wire.protocol.POOL_HEADER` (worker id, line):

* ``READY``: a line is open (the first one tells that the worker is up);
* ``PARTIAL``: results of tasks of the batch the line holds, sent as they finished
  while the rest of the batch runs (on a line of their own; never answered);
* ``RESULTS``: the batch's last results (those no ``PARTIAL`` carried), and the line is
  open again; it says how long the batch's tasks ran on the worker
  (:data:`~fiber.wire.protocol.BATCH_TIME`), the pool's estimate of a task's time;
* ``STARTED``: the worker begins the suspect batch of a line (sent on a third line,
  answered at once);
* ``GIVE``: the ids of tasks of a line's batch the worker gives back (none the first
  time), on its give line, which stays parked until the table recalls tasks
  (answered ``RECALL``) or dismisses the worker (``STOP``).

A request from a worker the pool no longer knows is answered ``STOP`` (a ``PARTIAL``
is not answered); if it carries results, they are the *lost results* of a worker given
up too early and are accepted.
Handlers run on the stream wire's selector thread, or on a thread that waits for an
``apply_async`` result and reads its worker's connection itself (:func:`wait_directly`).
Such a thread takes the *reply path* (:meth:`PoolChannel.direct`): a ``RESULTS`` frame
it reads is decoded on that thread before the pool's lock is taken and handled as any
request (the same :func:`_handle`, in order behind what the selector thread queued),
without passing the hub's dispatch.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable

from fiber.runtime.pool import observe
from fiber.runtime.pool.lines import Handoff
from fiber.runtime.pool.observe import TaskError
from fiber.runtime.pool.result_codec import Results, decode, failure
from fiber.runtime.pool.results import ApplyResult
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import Outcome, Task, settle
from fiber.wire import serialization, transport
from fiber.wire.protocol import BATCH_TIME, CHANNEL, MSG, POOL_HEADER, PoolOp, TaskKind

_READY, _RESULTS, _STARTED, _STOP = PoolOp.READY, PoolOp.RESULTS, PoolOp.STARTED, PoolOp.STOP
_PARTIAL, _GIVE = PoolOp.PARTIAL, PoolOp.GIVE
_HEADER_END = 1 + POOL_HEADER.size
_RESULTS_END = _HEADER_END + BATCH_TIME.size  # a RESULTS message's results begin here
# in a whole frame's body (MSG, the channel's number, then the request)
_REQUEST = len(MSG) + CHANNEL.size
_FRAME_RESULTS = _REQUEST + _RESULTS_END
_monotonic = time.monotonic

logger = logging.getLogger("fiber")


class PoolChannel:
    """Hub channel of one pool; forwards to its pending table while the pool exists
    (the table is held weakly, so that an unreferenced pool can be collected)."""

    def __init__(self, scheduler: Scheduler, lock: threading.RLock) -> None:
        self._scheduler = weakref.ref(scheduler)
        self._lock = lock
        # the selector thread hands lines over without waiting for the lock
        self._handoff = Handoff(lock)
        # how a RESULTS frame for this channel begins (MSG, its number, the op): those
        # direct() takes; none until the hub has numbered it (serve_as)
        self._results_frame: bytes | None = None
        self.direct_results = 0  # RESULTS frames taken by the reply path (tests, bench)

    def serve_as(self, cid: int) -> None:
        """The hub serves this channel as number ``cid`` (:meth:`direct` needs it)."""
        self._results_frame = MSG + CHANNEL.pack(cid) + _RESULTS

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            request.reply(_STOP)
            return
        if len(payload) < _HEADER_END:
            request.reply(b"malformed pool request", transport.ERROR)
            return
        self._handoff.run(_handle, scheduler, request, payload, None, self)

    def direct(self, request: transport.Request, body: bytes) -> bool:
        """The reply path: a whole frame ``body`` read on a worker's connection by a
        thread that waits there for an ``apply_async`` result (:func:`wait_directly`,
        which offers it every frame it reads). A ``RESULTS`` request for this channel
        is decoded here, before the pool's lock is taken, and handled under it as the
        hub's dispatch would have it handled (:func:`_handle`: the batch's records, the
        line parked and offered its next task, a lost worker's late results; in order
        behind what the selector thread queued), its outcomes delivered after.
        False for any other frame: the hub dispatches it."""
        prefix = self._results_frame
        if prefix is None or not body.startswith(prefix) or len(body) < _FRAME_RESULTS:
            return False
        scheduler = self._scheduler()
        if scheduler is None:
            return False
        payload = memoryview(body)[_REQUEST:]
        items = decode(payload[_RESULTS_END:])  # (never raises for a value)
        self.direct_results += 1
        self._handoff.run(_handle, scheduler, request, payload, items, self)
        return True

    def peer_gone(self, peer: int) -> None:
        scheduler = self._scheduler()
        if scheduler is None:
            return
        self._handoff.run(_peer_gone, scheduler, peer)


def _handle(scheduler: Scheduler, request: transport.Request, payload: memoryview,
            items: Results | None = None,
            channel: PoolChannel | None = None) -> Callable[[], None] | None:
    """Handle a worker's request (the pool's lock is held); returns the delivery of
    the results it carried, to be called without the lock. ``items``: the results of
    a ``RESULTS`` request, decoded already (the reply path's); ``channel``: the one
    the request came to (a worker's reply path is its channel's)."""
    try:
        op = bytes(payload[:1])
        wid, line = POOL_HEADER.unpack_from(payload, 1)
        done: list[Outcome] = []
        w = scheduler.workers.get(wid)
        if w is None or not w.alive or line not in (0, 1):
            if (op == _RESULTS or op == _PARTIAL) and scheduler.lost.get(wid):
                start = _RESULTS_END if op == _RESULTS else _HEADER_END
                done = scheduler.lost_results(
                    wid, decode(payload[start:]) if items is None else items)
            if op != _PARTIAL:
                request.reply(_STOP)
        elif op == _RESULTS:  # (first: the one message of an apply_async round trip)
            busy, ran = BATCH_TIME.unpack_from(payload, _HEADER_END)
            if items is None:
                items = decode(payload[_RESULTS_END:])
            scheduler.timed(w, _monotonic(), ran, busy)
            done = scheduler.results(w, line, request, items)
            scheduler.meter.tick(w.since, scheduler.done + scheduler.failed)
        elif op == _PARTIAL:
            items = decode(payload[_HEADER_END:])
            w.since = _monotonic()  # its next task begins
            done = scheduler.partial(w, line, items)
            scheduler.meter.tick(w.since, scheduler.done + scheduler.failed)
        elif op == _READY:
            if channel is not None:
                w.direct = channel.direct  # its lines come here: so do its replies
            scheduler.ready(w, line, request)
        elif op == _GIVE:
            scheduler.given(w, line, request, serialization.loads(payload[_HEADER_END:]))
        elif op == _STARTED:
            scheduler.started_batch(w, line)
            request.reply(b"")
        else:
            request.reply(b"unknown pool request", transport.ERROR)
    except Exception:  # noqa: BLE001 - a bad request must not stop the others
        logger.exception("the pool failed to handle a request")
        if not request.answered:
            request.reply(b"internal error", transport.ERROR)
        return None
    if not done:
        return None
    return functools.partial(deliver, done, scheduler.errors, scheduler.func_name)


def _peer_gone(scheduler: Scheduler, peer: int) -> Callable[[], None] | None:
    w = scheduler.by_peer.get(peer)
    failed = scheduler.lose(w) if w is not None else []
    return functools.partial(settle, failed) if failed else None


def deliver(done: Iterable[Outcome], errors: collections.deque[TaskError] | None = None,
            func_name: Callable[[int], str] | None = None) -> None:
    """Deliver results as workers sent them (errors packed, or an
    :class:`~fiber.runtime.pool.result_codec.Unloadable`; the failures are kept in
    ``errors``, see :mod:`~fiber.runtime.pool.observe`); call without the lock.
    ``func_name(fid)`` names a task's function in the error of a result that could not
    be unpickled."""
    for task, ok, value in done:
        if not ok:
            value = failure(value, functools.partial(_name, task, func_name))
            if errors is not None:
                observe.record_errors(errors, ((task, ok, value),))
        try:
            task.sink._set(task.start, task.count, ok, value)
        except Exception:  # noqa: BLE001 - a user's callback must not stop the pool
            logger.exception("a callback of pool task %s raised", task.describe())


def _name(task: Task, func_name: Callable[[int], str] | None) -> str:
    """A task, for an error: its function, and its arguments or its place in the map."""
    func = func_name(task.fid) if func_name is not None else f"function #{task.fid}"
    if task.kind == TaskKind.CALL:
        return f"{func}, {task.describe()}"
    if task.count == 1:
        return f"{func}, item {task.start} of the map"
    return f"{func}, items {task.start}-{task.start + task.count - 1} of the map (a chunk)"


def wait_directly(task: Task, result: ApplyResult, timeout: float | None) -> None:
    """Wait for ``result`` by reading its worker's connection on this thread (see
    :meth:`fiber.wire.stream.StreamListener.read_directly`), its results taking the
    reply path (:meth:`PoolChannel.direct`); returns early, leaving the caller to wait
    as usual, when the task is not with a worker or moves to another."""
    w = task.worker
    if w is None or not w.alive:
        return
    read_until = getattr(w.wire, "read_until", None)
    if read_until is None:
        return
    read_until(lambda: result._ready or task.worker is not w or not w.alive, timeout,
               w.direct)
