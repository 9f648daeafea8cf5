"""A durable pool's calls: each ``map``, ``starmap``, ``imap``, ``imap_unordered`` and
``apply_async`` of a ``fiber.Pool(journal=...)`` is numbered (the n-th durable call of
the program), answered from the journal where the journal holds the same work (same
call number, same function identity, same position, same item hash:
:mod:`~fiber.runtime.journal.identity`), and runs only the rest on the workers, whose
results are journaled as they arrive.

The pool is reached through three of its private methods (``_chunks``, ``_submit_call``
and ``_size_hint``), so that the journal needs nothing of the pending table: its results
go through a :class:`Recorder`, a sink that journals and then hands them to the call's
own result object at their places in the whole input.

``imap`` and ``imap_unordered`` read their input a window of :data:`WINDOW` items at a
time (each window one durable call, the next one running while the program takes the
results of the one before), so that their calls are numbered alike in every run of the
program, whatever the pool's size.
"""

from __future__ import annotations

import collections
import itertools
import logging
import pickle
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fiber.errors import SerializationError, TimeoutError
from fiber.runtime.journal import registry
from fiber.runtime.journal.identity import function_identity, item_hash
from fiber.runtime.journal.store import Journal, Known
from fiber.runtime.pool.results import ApplyResult, IMapIterator
from fiber.wire import serialization
from fiber.wire.protocol import TaskKind

__all__ = ["WINDOW", "Durable", "Recorder"]

logger = logging.getLogger("fiber")

#: items of an imap's input read (and journaled) as one durable call
WINDOW = 1024

_KIND_NAMES = {TaskKind.MAP: "map", TaskKind.STARMAP: "starmap", TaskKind.CALL: "apply"}


class Recorder:
    """A sink that journals the results of ``positions`` (the items a durable call
    runs, ascending) and hands every outcome on to ``sink`` at those positions."""

    __slots__ = ("sink", "journal", "call", "positions", "hashes", "single", "__weakref__")

    def __init__(self, sink: Any, journal: Journal, call: int, positions: Sequence[int],
                 hashes: Sequence[bytes], single: bool = False) -> None:
        self.sink = sink
        self.journal = journal
        self.call = call
        self.positions = positions
        self.hashes = hashes
        self.single = single  # an apply_async: the value is the result, not a list

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        positions = self.positions[start:start + count]
        if ok:
            values = [value] if self.single else value
            self.journal.add(self.call, self._rows(positions, values))
        if self.single:
            self.sink._set(0, 1, ok, value)
        elif not ok:
            self.sink._set(positions[0], count, False, value)
        else:
            _deliver(self.sink, positions, value)

    def _rows(self, positions: Sequence[int], values: Sequence[Any]
              ) -> list[tuple[int, bytes, bytes]]:
        rows = []
        for pos, value in zip(positions, values, strict=True):
            try:
                pickled = serialization.pickle_object(value)
            except SerializationError:  # (it reached here pickled: rare; not journaled)
                logger.debug("journal %s: a result of call %d could not be pickled",
                             self.journal.path, self.call, exc_info=True)
                continue
            rows.append((pos, self.hashes[pos], pickled))
        return rows


def _deliver(sink: Any, positions: Sequence[int], values: Sequence[Any]) -> None:
    """Hand ``values`` to ``sink`` at ``positions``, a ``_set`` per run of consecutive
    positions."""
    i, n = 0, len(positions)
    while i < n:
        j = i + 1
        while j < n and positions[j] == positions[j - 1] + 1:
            j += 1
        sink._set(positions[i], j - i, True, list(values[i:j]))
        i = j


class Durable:
    """The durable calls of one pool, over the journal at ``path``."""

    def __init__(self, pool: Any, path: Any) -> None:
        self.pool = weakref.proxy(pool)  # (the pool holds this: no cycle)
        self.journal = registry.acquire(path)
        # a pool dropped without being ended (its __init__ raised, say) lets go too
        self._release = weakref.finalize(pool, registry.release, self.journal)

    def release(self) -> None:
        """The pool is done with the journal (closed when no other pool of this
        program uses it); raises the error of a write that failed."""
        self._release()

    def _begin(self, func: Callable[..., Any], kind: int) -> tuple[int, Known]:
        return self.journal.begin(function_identity(func), _KIND_NAMES[kind])

    def chunks(self, func: Callable[..., Any], items: Sequence[Any], chunksize: int | None,
               kind: int, sink: Any, call_name: str) -> Any:
        """A map or starmap of ``items`` whose outcomes go to ``sink``: journaled
        results handed over at once, the rest run (``Pool._chunks``)."""
        call, known = self._begin(func, kind)
        hashes = [item_hash(x) for x in items]
        missing: list[int] = []
        hits: list[int] = []
        values: list[Any] = []
        for pos, h in enumerate(hashes):
            entry = known.get(pos)
            if entry is not None and entry[0] == h:
                hits.append(pos)
                values.append(pickle.loads(entry[1]))
            else:
                missing.append(pos)
        if hits:
            logger.debug("journal %s: call %d: %d of %d results from the journal",
                         self.journal.path, call, len(hits), len(items))
            _deliver(sink, hits, values)
        if missing:
            recorder = Recorder(sink, self.journal, call, missing, hashes)
            part = items if len(missing) == len(items) else [items[p] for p in missing]
            self.pool._chunks(func, part, chunksize, kind, recorder, call_name)
        return sink

    def apply(self, func: Callable[..., Any], args: Iterable[Any],
              kwds: Any, result: ApplyResult[Any]) -> ApplyResult[Any]:
        call, known = self._begin(func, TaskKind.CALL)
        args = tuple(args)
        h = item_hash((args, dict(kwds) if kwds else {}))
        entry = known.get(0)
        if entry is not None and entry[0] == h:
            result._finish(True, pickle.loads(entry[1]))
            return result
        self.pool._submit_call(func, args, kwds, result,
                               Recorder(result, self.journal, call, [0], [h], single=True))
        return result

    def imap(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int,
             ordered: bool, call_name: str) -> DurableIMapIterator:
        return DurableIMapIterator(self, func, iterable, chunksize, ordered, call_name)


class _Window:
    """The outcomes of one window of a durable imap: in input order, or (unordered)
    in the order they arrive."""

    def __init__(self, length: int, ordered: bool) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.length = length
        self.ordered = ordered
        self.outcomes: dict[int, tuple[bool, Any]] = {}
        self.arrived: collections.deque[tuple[bool, Any]] = collections.deque()
        self.taken = 0

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        with self.cond:
            for i in range(count):
                outcome = (True, value[i]) if ok else (False, value)
                if self.ordered:
                    self.outcomes[start + i] = outcome
                else:
                    self.arrived.append(outcome)
            self.cond.notify_all()

    def take(self, timeout: float | None) -> tuple[bool, Any] | None:
        """The next outcome (None: the window is done); TimeoutError after ``timeout``."""
        with self.cond:
            if self.taken >= self.length:
                return None
            if self.ordered:
                ready: Callable[[], bool] = lambda: self.taken in self.outcomes  # noqa: E731
            else:
                ready = lambda: bool(self.arrived)  # noqa: E731
            if not self.cond.wait_for(ready, timeout):
                raise TimeoutError
            outcome = self.outcomes.pop(self.taken) if self.ordered else self.arrived.popleft()
            self.taken += 1
            return outcome


class DurableIMapIterator(IMapIterator[Any]):
    """The iterator of a durable ``imap``/``imap_unordered`` (see the module): the
    next window is submitted while the results of the current one are taken."""

    def __init__(self, durable: Durable, func: Callable[..., Any], iterable: Iterable[Any],
                 chunksize: int, ordered: bool, call_name: str) -> None:
        super().__init__()
        self._durable = durable
        self._func = func
        self._input: Iterator[Any] = iter(iterable)
        self._chunksize = chunksize
        self._ordered = ordered
        self._call_name = call_name
        self._windows: collections.deque[_Window] = collections.deque()
        self._input_error: BaseException | None = None
        self._exhausted = False
        self._take_lock = threading.Lock()
        self._fill()

    def _fill(self) -> None:
        """Keep two windows submitted while the input lasts."""
        while len(self._windows) < 2 and not self._exhausted:
            try:
                items = list(itertools.islice(self._input, WINDOW))
            except Exception as exc:  # noqa: BLE001 - raised after the results before it
                self._input_error, self._exhausted, items = exc, True, []
            if len(items) < WINDOW:
                self._exhausted = True
            if not items:
                break
            window = _Window(len(items), self._ordered)
            self._durable.chunks(self._func, items, self._chunksize, TaskKind.MAP, window,
                                 self._call_name)
            self._windows.append(window)

    def __iter__(self) -> Iterator[Any]:
        return self

    def next(self, timeout: float | None = None) -> Any:
        with self._take_lock:
            while self._windows:
                outcome = self._windows[0].take(timeout)
                if outcome is None:
                    self._windows.popleft()
                    self._fill()
                    continue
                ok, value = outcome
                if ok:
                    return value
                raise value
            if self._input_error is not None:
                error, self._input_error = self._input_error, None
                raise error
            raise StopIteration

    __next__ = next
