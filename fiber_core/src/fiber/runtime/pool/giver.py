"""The give line of a Pool worker: tasks the master recalls that the worker has not
started are given back from here (:class:`Giver`), and the recall guard a batch runs
with (:func:`guard`).

A worker keeps a fourth request line open while the master wants it, the *give line*
(``GIVE``): a batch flagged ``OPEN_GIVE`` (the worker's first) opens it, a ``STOP``
answer closes it. A ``RECALL`` answer on it names a line, the number of the batch on
that line and task ids; the worker gives back those it has not started (it will skip
them) and says which in its next ``GIVE``, so a task is run by one worker only
(:mod:`fiber.runtime.pool.worker` runs the batches; :mod:`fiber.runtime.pool.recall`
is the master's side).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from fiber import threads
from fiber.errors import ConnectionLostError, FiberThreadError
from fiber.wire import serialization
from fiber.wire.protocol import OK, BatchFlag, PoolOp
from fiber.wire.protocol import POOL_HEADER as _HEADER

__all__ = ["Giver", "guard"]

GIVE = PoolOp.GIVE
STOP = PoolOp.STOP
KEPT = BatchFlag.KEPT


class Giver:
    """Gives back, from a thread of its own, tasks the master recalls that the worker has
    not started (the give line; see the module's docstring).

    The main thread calls :meth:`begin` before each task and :meth:`end_batch` after
    each batch; a recall (line, batch number on that line, ids) is granted for the ids
    not started, provided that batch has not ended, and those ids are skipped when
    their turn comes. The lock makes "started" and "given back" exclusive. The give
    line is opened by :meth:`open` (main thread) and closed by the master's ``STOP``;
    the thread serves it as many times as it was opened.

    On a connection that a thread always reads (the job's, read by its heartbeat:
    ``always_read``) the thread starts only with the first recall: the main thread
    sends the ``GIVE`` that opens the line, and the thread reading the connection
    hands the line's replies to :meth:`_replied` (a ``STOP`` it handles itself); most
    workers are never asked to give back, and a thread was a tenth of a worker's
    start (issue #29)."""

    def __init__(self, client: Any, cid: int, worker_id: int) -> None:
        self._ctx = client.context()
        self._cid = cid
        self._worker_id = worker_id
        self._opening = GIVE + _HEADER.pack(worker_id, 0) + serialization.dumps([])
        # no thread until the first recall (see the class): the reader's hook
        self._lazy = bool(getattr(client, "always_read", False))
        self._asking = False  # (lazy) an opening GIVE is out, its reply not read
        self._resume = False  # the thread starts with an opening out (a recall came)
        if self._lazy:
            self._ctx.on_reply(self._replied)
        self._lock = threading.Lock()
        self.line = 0  # the line whose batch runs (set by the main thread)
        self._ended = [0, 0]  # batches ended, per line
        self._started: set[int] = set()  # tasks begun in the running batch
        self._skip: tuple[set[int], set[int]] = (set(), set())  # given back, per line
        self._opened = 0  # times the master asked for the give line
        self._closed = 0  # times it closed it
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        #: why the thread died (then every task not started yet fails with it)
        self.error: FiberThreadError | None = None
        self._up = threading.Event()  # the thread runs, or has died

    def open(self) -> None:
        """The master asks for the give line (main thread)."""
        send = False
        with self._changed:
            self._opened += 1
            self._changed.notify()
            if self._lazy and not self._asking:
                send = self._asking = True
        if send:
            try:
                self._ctx.send(self._cid, self._opening)
            except ConnectionLostError:
                pass  # the main thread finds out on its lines
            return
        if self._thread is None and not self._lazy:
            self._thread = threads.start("fiber-pool-give", self._run, fails=self._died)
            self._up.wait()  # (a thread dying as it starts fails the first batch)

    def _replied(self, reply: bytes) -> bool:
        """(No thread yet) a reply on the give line, in the thread that read it: a
        ``STOP`` closes the line (opened again at once if the master asked meanwhile);
        anything else (a recall) starts the thread, which takes it from the line's
        queue (False: queue it). A thread dying as it starts fails the tasks not
        started yet (its error, :func:`run_batch`)."""
        if reply[:1] == OK and reply[1:2] == STOP:
            with self._changed:
                self._closed += 1
                again = self._opened > self._closed
                self._asking = again
            if again:
                try:
                    self._ctx.send(self._cid, self._opening)
                except ConnectionLostError:
                    pass
            return True
        with self._changed:  # (held: open() must not start a thread meanwhile)
            self._ctx.on_reply(None)
            self._lazy = False
            self._resume = True
            try:
                self._thread = threads.start("fiber-pool-give", self._run, fails=self._died)
            except Exception as exc:  # noqa: BLE001 - not in the reader's thread: fail the tasks
                error = FiberThreadError(f"cannot start fiber thread 'fiber-pool-give': "
                                         f"{exc}", thread="fiber-pool-give")
                error.__cause__ = exc
                self._died(error)
        return False

    def _died(self, error: FiberThreadError) -> None:
        """The thread died (in it): recalls go unanswered, so the worker cannot tell
        which tasks the master takes back; every task it has not started fails with
        ``error`` instead of running (:func:`run_batch`), so the waiting call raises."""
        self.error = error
        self._up.set()

    def begin(self, task_id: int) -> bool:
        """Whether to run ``task_id`` (False: it was given back); it counts as started."""
        with self._lock:
            if task_id in self._skip[self.line]:
                return False
            self._started.add(task_id)
            return True

    def given_back(self) -> int:
        """How many tasks of the running batch were given back (not run here)."""
        with self._lock:
            return len(self._skip[self.line])

    def end_batch(self) -> int:
        """The running batch ended (before its line's results go); returns how many of
        its tasks were given back (as :meth:`given_back`, in the same lock round)."""
        with self._lock:
            skip = self._skip[self.line]
            given = len(skip)
            self._ended[self.line] += 1
            self._started.clear()
            skip.clear()
            return given

    def grant(self, line: int, number: int, ids: Sequence[int]) -> list[int]:
        """The ids of a recall the worker gives back."""
        with self._lock:
            if line not in (0, 1) or self._ended[line] >= number:
                return []  # that batch is over: every task of it ran
            given = [tid for tid in ids if tid not in self._started]
            self._skip[line].update(given)
            return given

    def _run(self) -> None:
        ctx = self._ctx
        opening = self._opening
        resume = self._resume  # (an opening is out: its reply, a recall, is queued)
        self._up.set()
        try:
            while True:
                if not resume:
                    with self._changed:
                        while self._opened <= self._closed:
                            self._changed.wait()
                    ctx.send(self._cid, opening)
                resume = False
                while True:
                    reply = ctx.recv()
                    if reply[:1] != PoolOp.RECALL:
                        break  # STOP: closed (no recall expected, or dismissed)
                    line, number, ids = serialization.loads(memoryview(reply)[1:])
                    given = self.grant(line, number, ids)
                    ctx.send(self._cid, GIVE + _HEADER.pack(self._worker_id, line)
                             + serialization.dumps(given))
                with self._changed:
                    self._closed += 1
        except ConnectionLostError:
            return  # the main thread finds out too


def guard(flags: int, giver: Giver) -> Giver | None:
    """The recall guard a batch runs with: none for a batch the master flags ``KEPT``
    (no task of it can be recalled, so the Giver's lock per task is skipped), unless
    the Giver's thread died (its tasks then fail with the cause, as every batch's)."""
    if flags & KEPT and giver.error is None:
        return None
    return giver
