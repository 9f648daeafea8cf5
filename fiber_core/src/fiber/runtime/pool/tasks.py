"""The records of the pool's pending table (:mod:`~fiber.runtime.pool.scheduler`): a
:class:`Task`, the master's mirror of a :class:`Worker`, the protocols of where a
task's outcome goes (:class:`Sink`) and of a worker's request (:class:`Line`), and
:func:`settle`, which delivers outcomes once the pool's lock is released.

The table's vocabulary (task, line, batch, parked, suspect, holder, ...) is in the
scheduler module's docstring; these records hold no logic beyond reading their own
fields.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from fiber.wire.protocol import TaskKind

logger = logging.getLogger("fiber")

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"  # a pool's states
STARTING, IDLE, BUSY, STOPPING = "starting", "idle", "busy", "stopping"  # a worker's
IDLE_LIST, SPARE = "idle", "spare"  # the table's lists of workers with a parked line

_CALL = TaskKind.CALL


class Sink(Protocol):
    """Where a task's outcome goes: a result object of :mod:`~fiber.runtime.pool.results`."""

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None: ...


class Line(Protocol):
    """A worker's request, answered once (:class:`fiber.wire.transport.Request`);
    ``peer`` names the worker's connection."""

    peer: int

    def reply(self, data: bytes) -> bool: ...


class Task:
    """One task: ``payload`` is ``(args, kwds)`` for a call, else a chunk of ``count``
    items that start at index ``start`` of the input. ``func`` is its function, held so
    that the table keeps the function's pickle while a task of it is left (it knows
    functions weakly: :mod:`~fiber.runtime.pool.functions`)."""

    __slots__ = ("id", "fid", "kind", "payload", "sink", "start", "count", "attempts",
                 "alone", "done", "superseded", "started", "worker", "func")

    def __init__(self, tid: int, fid: int, kind: int, payload: Any, sink: Sink, start: int,
                 count: int, func: Any = None) -> None:
        self.id = tid
        self.fid = fid
        self.func = func
        self.kind = kind
        self.payload = payload
        self.sink = sink
        self.start = start
        self.count = count
        self.attempts = 0
        self.alone = False  # a suspect task: runs in a batch of its own
        self.done = False  # its outcome was delivered
        self.superseded = False  # split into items that run instead
        self.started = False  # a worker confirmed it began this (suspect) task
        self.worker: Worker | None = None  # the worker it was last sent to

    def describe(self) -> str:
        if self.kind == _CALL:
            args, kwds = self.payload
            return f"call with args={args!r:.200} kwds={kwds!r:.100}"
        if self.count > 1:  # a chunk: its time is that of all its items
            return (f"items {self.start}-{self.start + self.count - 1} "
                    f"({self.payload[0]!r:.200}, ...)")
        return f"item {self.start} ({self.payload[0]!r:.200})"


class Worker:
    """The master's mirror of one worker: which of its two lines are parked here, which
    hold a batch, and the order in which the worker waits on them. ``process`` is set by
    the worker set, ``peer``, ``wire`` and ``direct`` by the channel; the table does not use
    them."""

    __slots__ = ("id", "process", "peer", "order", "parked", "held", "funcs",
                 "dispatched", "stopping", "dismissed", "alive", "connected", "listed",
                 "wire", "since", "giving", "sent", "recalling", "recall_line", "awaiting",
                 "give_open", "direct", "born", "forget")

    def __init__(self, wid: int) -> None:
        self.id = wid
        self.process: Any = None
        self.peer: int | None = None
        self.order: collections.deque[int] = collections.deque((0, 1))
        self.parked: dict[int, Line] = {}
        self.held: dict[int, dict[int, Task]] = {}  # line -> its tasks without a result
        self.funcs: set[int] = set()  # functions it has (sent once)
        self.dispatched = 0  # tasks sent to it
        self.stopping = False  # let go (resize, maxtasksperchild): ends after its batches
        self.dismissed = False  # told to exit (a line was answered STOP)
        self.alive = True
        self.connected = False
        self.listed = ""  # the table's list it is in: "idle", "spare" or none ("")
        self.wire: Any = None  # a request it sent: its connection, for reading directly
        # what a direct reader of that connection offers each frame (the reply path of
        # the pool's channel its lines come to, channel.PoolChannel.direct), or None
        self.direct: Any = None
        self.since = 0.0  # when its task in progress began (observe.py), time.monotonic()
        self.giving: Line | None = None  # its give line, parked here (no recall under way)
        self.sent = [0, 0]  # batches sent on each line
        self.recalling: dict[int, Task] = {}  # tasks asked back, until its GIVE answers
        self.recall_line = 0  # the line they were asked back from
        self.awaiting = False  # idle, and tasks were asked back from others for it
        self.give_open = False  # it was asked to open its give line (not closed since)
        self.born = time.time()  # when it was asked for (Pool.stats' uptime)
        self.forget: list[int] = []  # functions it has that are freed: told with a batch

    @property
    def busy(self) -> bool:
        return bool(self.held)

    @property
    def state(self) -> str:
        """``starting``, ``idle``, ``busy`` or ``stopping``."""
        if self.stopping or self.dismissed:
            return STOPPING
        if not self.connected:
            return STARTING
        return BUSY if self.held else IDLE

    def free_line(self) -> int | None:
        """The line to answer next: the first in the worker's waiting order that is
        parked here, provided every line before it already holds a batch."""
        for line in self.order:
            if line in self.parked:
                return line
            if line not in self.held:
                return None
        return None

    def running(self) -> list[Task]:
        """The tasks of the batch the worker is running (the first line in its order,
        if it holds one) that have no result yet, in the order it runs them."""
        if not self.order:
            return []
        batch = self.held.get(self.order[0])
        return list(batch.values()) if batch else []


Outcome = tuple[Task, bool, Any]  # a task, whether it succeeded, its value or error


def settle(outcomes: Iterable[Outcome]) -> None:
    """Deliver outcomes whose errors are exception objects; call without the lock."""
    for task, ok, value in outcomes:
        try:
            task.sink._set(task.start, task.count, ok, value)
        except Exception:  # noqa: BLE001 - a user's callback must not stop the pool
            logger.exception("a callback of pool task %s raised", task.describe())
