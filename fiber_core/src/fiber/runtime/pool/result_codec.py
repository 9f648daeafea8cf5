"""How a pool worker's results travel to the master, so that a result that cannot
travel fails its own task and nothing else, at no cost to those that can.

A message (``PARTIAL`` or ``RESULTS``) carries ``[(task_id, ok, value), ...]``, where a
failure's value is a packed exception (bytes), pickled as any fiber message
(:func:`fiber.wire.serialization.dumps`: pickle, else cloudpickle; big buffers out of
band). That is all the worker does while its results can be pickled (:func:`encode`),
and all the master does while they can be unpickled (:func:`decode`: one C
``pickle.loads``).

* **In the worker**, when pickling the list raises (a value nothing can pickle: a lock,
  a generator; or one nested too deep), each value is pickled alone, and those that
  fail fail their task with multiprocessing's ``MaybeEncodingError``
  (:func:`unpicklable`), built from a bounded ``repr``: a value whose ``repr`` raises
  (``RecursionError`` for a deeply nested list) or is huge costs neither the worker
  nor the message. The worker goes on.
* **In the master**, when loading the list raises (a class missing there, a
  ``__reduce__`` callable or ``__setstate__`` that raises), it is loaded again by an
  unpickler whose opcodes that run a value's code are guarded: each one that raises
  leaves a stand-in, the other results load, and the results it happened in become
  :class:`Unloadable` outcomes, which fail their own tasks with
  :class:`~fiber.errors.ResultUnpicklingError` naming the task (:func:`failure`). The
  results before and after it are delivered.

A task never fails as a lost worker for its result's sake, and is not run again. (An
earlier layout sent each non-plain result as a pickle of its own, to load them one by
one; it cost 10-40% of the results per second of a dataclass-returning map, and the
guarded loading below needs none of it.)
"""

from __future__ import annotations

import io
import logging
import pickle
import reprlib
from collections.abc import Callable
from typing import Any

from fiber.errors import ResultUnpicklingError, SerializationError
from fiber.wire import serialization

logger = logging.getLogger("fiber")

Results = list[tuple[int, bool, Any]]

_repr = reprlib.Repr()
_repr.maxlevel = 4
_repr.maxstring = _repr.maxother = 200
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 10


def bounded_repr(value: Any) -> str:
    """``repr(value)``, at most a few hundred characters and a few levels deep; never
    raises (a ``repr`` that does is replaced by a description of the object)."""
    try:
        return _repr.repr(value)
    except Exception:  # noqa: BLE001 - a value's repr may do anything
        return f"<{type(value).__qualname__} object at {id(value):#x} (repr failed)>"


class _Shown:
    """Stands for a value in ``MaybeEncodingError``, which takes ``repr()`` of it."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def unpicklable(exc: BaseException, value: Any) -> Exception:
    """multiprocessing's ``MaybeEncodingError`` for ``value``, which pickling failed
    with ``exc`` (the pickle library's own exception, not fiber's wrapper, as
    multiprocessing reports it)."""
    import multiprocessing.pool  # lazy: only for a result that cannot be pickled

    if isinstance(exc, SerializationError) and exc.__cause__ is not None:
        exc = exc.__cause__
    error: type[Exception] = multiprocessing.pool.MaybeEncodingError  # type: ignore[attr-defined]  # missing from typeshed
    return error(_Shown(bounded_repr(exc)), _Shown(bounded_repr(value)))


def encode(results: Results, head: bytes = b"") -> bytes:
    """``head`` and the body of a message carrying ``results``: one pickle of the list,
    as any fiber message (:func:`fiber.wire.serialization.dumps`). Should that raise
    (a value nothing can pickle, or one too deep), each value is tried alone and those
    that fail fail their task with ``MaybeEncodingError``."""
    try:
        return head + serialization.dumps(results)
    except Exception:  # noqa: BLE001 - what pickling a value raises is the value's
        return head + serialization.dumps(_sendable(results))


def _sendable(results: Results) -> Results:
    """``results`` with each value that neither pickle nor cloudpickle can do replaced
    by the failure of its task."""
    out: Results = []
    for task_id, ok, value in results:
        try:
            serialization.pickle_object(value, [])
        except Exception as exc:  # noqa: BLE001 - the task fails, not the worker
            out.append((task_id, False, serialization.pack_exception(unpicklable(exc, value))))
        else:
            out.append((task_id, ok, value))
    return out


class Unloadable:
    """The outcome of a task whose value the master could not unpickle: ``exc`` is
    what unpickling raised."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _Failed:
    """Stands, in a stream loaded again, for what an opcode could not make."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_Base: Any = pickle._Unpickler  # the pure-Python one: its opcodes can be guarded


class _GuardedUnpickler(_Base):
    """Loads a message's list of results again, an opcode that raises (running a
    value's code) making a :class:`_Failed` in its place, so that the memo stays in
    step with the pickler's and the other results load. ``failed`` maps the place of
    each result whose loading raised to the first exception.

    Which result is loading is read from the list's layout, which pickle writes as
    ``EMPTY_LIST`` then, for more than one item, batches of ``MARK item ... APPENDS``
    (one ``APPEND`` for a single item); each item is ``task_id ok value TUPLE3``. A
    ``TUPLE3`` closes a result when it takes the three objects just above the results
    already closed in the batch: a tuple inside a value is built higher up."""

    dispatch = dict(_Base.dispatch)

    def __init__(self, file: Any, buffers: Any) -> None:
        super().__init__(file, buffers=buffers)
        self.failed: dict[int, BaseException] = {}
        self._before = 0  # results appended to the list by earlier batches
        self._closed = 0  # results closed in this batch

    def failure(self, exc: BaseException) -> None:
        self.failed.setdefault(self._before + self._closed, exc)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except Exception as exc:  # noqa: BLE001 - a class missing here
            self.failure(exc)
            return _Failed(exc)

    def _tuple3(self) -> None:
        batch = len(self.metastack)  # 1 inside a batch's MARK, 0 for a single item
        closing = (batch == 1 and len(self.stack) == self._closed + 3) or (
            batch == 0 and len(self.stack) == 4)
        _Base.dispatch[pickle.TUPLE3[0]](self)
        if closing:
            self._closed += 1

    def _appends(self) -> None:
        top = len(self.metastack) == 1
        _guarded_appends(self)
        if top:
            self._before += self._closed
            self._closed = 0

    dispatch[pickle.TUPLE3[0]] = _tuple3


def _replacing_top(op: Callable[[Any], None], memoized: bool) -> Callable[[Any], None]:
    """``op`` guarded: should it raise, the object on top of the stack (a function
    that raised, or an object whose filling raised) becomes a :class:`_Failed`; when
    ``memoized`` (the op fills an object made and memoized earlier), in the memo too,
    so that a result referring to it later fails as well."""
    def guarded(self: _GuardedUnpickler) -> None:
        try:
            op(self)
        except Exception as exc:  # noqa: BLE001 - a value's code raised
            self.failure(exc)
            broken, failed = self.stack[-1], _Failed(exc)
            self.stack[-1] = failed
            if memoized:
                for key, value in list(self.memo.items()):
                    if value is broken:
                        self.memo[key] = failed
    return guarded


def _popping(op: Callable[[Any], None], count: int) -> Callable[[Any], None]:
    def guarded(self: _GuardedUnpickler) -> None:
        depth = len(self.stack) - count
        try:
            op(self)
        except Exception as exc:  # noqa: BLE001 - a value's code raised
            self.failure(exc)
            del self.stack[depth:]
            self.stack.append(_Failed(exc))
    return guarded


def _getting(op: Callable[[Any], None]) -> Callable[[Any], None]:
    def guarded(self: _GuardedUnpickler) -> None:
        op(self)
        if type(self.stack[-1]) is _Failed:  # what failed in an earlier result
            self.failure(self.stack[-1].exc)
    return guarded


_GuardedUnpickler.dispatch[pickle.REDUCE[0]] = _replacing_top(
    _Base.dispatch[pickle.REDUCE[0]], memoized=False)
for _code in (pickle.BUILD, pickle.APPEND, pickle.SETITEM, pickle.SETITEMS, pickle.ADDITEMS):
    _GuardedUnpickler.dispatch[_code[0]] = _replacing_top(_Base.dispatch[_code[0]],
                                                          memoized=True)
_guarded_appends = _replacing_top(_Base.dispatch[pickle.APPENDS[0]], memoized=True)
_GuardedUnpickler.dispatch[pickle.APPENDS[0]] = _GuardedUnpickler._appends
for _code, _count in ((pickle.NEWOBJ, 2), (pickle.NEWOBJ_EX, 3)):
    _GuardedUnpickler.dispatch[_code[0]] = _popping(_Base.dispatch[_code[0]], _count)
for _code in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET):
    _GuardedUnpickler.dispatch[_code[0]] = _getting(_Base.dispatch[_code[0]])


def _guarded_load(data: Any, buffers: Any = None) -> Results:
    unpickler = _GuardedUnpickler(io.BytesIO(data), buffers)
    results: Results = unpickler.load()
    for place, exc in unpickler.failed.items():
        place = min(place, len(results) - 1)  # (after the last result: cannot be)
        results[place] = results[place][0], False, Unloadable(exc)
    return results


def decode(body: memoryview) -> Results:
    """The results of a message body (:func:`encode`). Never raises for a value: one
    that cannot be unpickled here comes as ``(task_id, False, Unloadable)``."""
    try:
        return serialization.loads(body)
    except Exception:  # noqa: BLE001 - loading a value runs its code
        return serialization.loads(body, _guarded_load)


def failure(value: Any, task: Callable[[], str]) -> BaseException:
    """The exception of a failed outcome: ``value`` is a packed exception or an
    :class:`Unloadable`; ``task()`` names the task (its function and its place)."""
    if isinstance(value, Unloadable):
        what, cause = "result", value.exc
    else:
        try:
            return serialization.unpack_exception(value)
        except BaseException as exc:  # noqa: BLE001 - loading runs user code
            what, cause = "exception", exc
    error = ResultUnpicklingError(
        f"pool task {task()}: its {what} could not be unpickled in the parent: "
        f"{type(cause).__name__}: {cause}. The task ran and is not run again; its "
        f"{what} must unpickle where the pool runs (its class importable there, its "
        "__reduce__ or __setstate__ working)")
    error.__cause__ = cause
    logger.debug("%s", error)
    return error
