"""How a pool worker's results travel to the master, so that a result that cannot
travel fails its own task and nothing else.

A message (``PARTIAL`` or ``RESULTS``) carries ``[(task_id, ok, value), ...]``, where a
failure's value is a packed exception (bytes). :meth:`ResultEncoder.encode` (worker)
writes it in one of two layouts:

* *plain*: one pickle of the list, as any fiber message. Used when every value is
  plain data (exact ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple``,
  ``dict``, ``set``, ...: pickle then never calls a ``__reduce__`` nor names a class,
  so unpickling runs no user code and cannot fail in the master). The check is free:
  pickle calls the pickler's ``reducer_override`` for any other object, and ours stops
  the pickling there.
* *grouped*: the same one pickle, behind the tasks' ids, when it also holds numpy
  scalars, dtypes or small arrays (or builtins reduced, such as ``len``): these load
  wherever numpy does, and pickled together they share one pickle of their classes
  (one by one, a numpy scalar costs ten times as much). If it fails in the master
  (numpy missing there), every task of the message fails, named.
* *framed*: any other result (instances of user classes, big arrays, functions)
  gets a pickle of its own, with a table of (task id, ok, length) in front. The
  master loads each on its own (:func:`decode`): one that raises (a class missing
  in the master, a ``__reduce__`` callable or ``__setstate__`` that raises) becomes an
  :class:`Unloadable` outcome of its task alone; the others are delivered. A big
  array keeps its buffer out of band there.

A value the worker cannot pickle at all fails its task with multiprocessing's
``MaybeEncodingError`` (:func:`unpicklable`), built from a bounded ``repr``, so a
value whose ``repr`` raises (``RecursionError`` for a deeply nested list) or is huge
costs neither the worker nor the message. A task never fails as a lost worker for its
result's sake.
"""

from __future__ import annotations

import array
import io
import logging
import pickle
import reprlib
import struct
from collections.abc import Callable
from typing import Any

from fiber.errors import ResultUnpicklingError, SerializationError
from fiber.wire import serialization

logger = logging.getLogger("fiber")

#: the first byte of a framed message body (a plain one starts with a pickle's b"\x80"
#: or :mod:`fiber.wire.serialization`'s b"\x01"/b"\x02")
FRAMED = b"\x10"
GROUPED = b"\x11"  # one pickle of trusted values, behind the tasks' ids
_COUNT = struct.Struct("<I")
_ITEM = struct.Struct("<QBQ")  # task id, ok, length of its value's bytes

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


class _NotPlain(Exception):
    pass


class _PlainPickler(pickle.Pickler):
    """Pickles plain data, and numpy's scalars, dtypes and small arrays (*trusted*: their
    unpickling runs only numpy's code, which fails only where numpy is missing; sent
    one by one they would cost ten times as much, a pickle of their class each); stops
    at the first other object pickle would reduce."""

    trusted = False  # an object of numpy's (or a builtin reduced) was pickled

    def reducer_override(self, obj: Any) -> Any:
        module: Any = type(obj).__module__
        if module == "builtins":  # a class or a function: its own module
            module = getattr(obj, "__module__", None)
        if not isinstance(module, str) or not (
                module == "numpy" or module.startswith("numpy.") or module == "builtins"):
            raise _NotPlain
        nbytes = getattr(obj, "nbytes", 0)
        if isinstance(nbytes, int) and nbytes >= serialization.OOB_THRESHOLD:
            raise _NotPlain  # a big array: framed, its buffer out of band
        self.trusted = True
        return NotImplemented


class ResultEncoder:
    """Encodes the results of one worker's messages (one encoder per thread that
    sends: its pickler and buffer are reused)."""

    def __init__(self) -> None:
        self._file = io.BytesIO()
        self._pickler = _PlainPickler(self._file, serialization.PROTOCOL)

    def encode(self, results: Results, head: bytes = b"") -> bytes:
        """``head`` and the body of a message carrying ``results`` (one copy)."""
        file, pickler = self._file, self._pickler
        file.seek(0)
        file.truncate()
        pickler.clear_memo()
        pickler.trusted = False
        try:
            pickler.dump(results)
        except Exception:  # noqa: BLE001 - _NotPlain, or what pickle cannot do (deep data)
            return _framed(results, head)
        if not pickler.trusted:
            return head + file.getvalue()
        ids = array.array("Q", [r[0] for r in results])
        return b"".join([head, GROUPED, _COUNT.pack(len(ids)), ids.tobytes(), file.getvalue()])


def _framed(results: Results, head: bytes) -> bytes:
    heads = [head, FRAMED, _COUNT.pack(len(results))]
    bodies = []
    for task_id, ok, value in results:
        if ok:
            try:
                body = serialization.dumps(value)
            except Exception as exc:  # noqa: BLE001 - the task fails, not the worker
                ok, body = False, serialization.pack_exception(unpicklable(exc, value))
        else:
            body = value
        heads.append(_ITEM.pack(task_id, ok, len(body)))
        bodies.append(body)
    return b"".join(heads + bodies)


class Unloadable:
    """The outcome of a task whose value the master could not unpickle: ``exc`` is
    what unpickling raised."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def decode(body: memoryview) -> Results:
    """The results of a message body (:meth:`ResultEncoder.encode`). Never raises for
    a value: one that cannot be unpickled here comes as ``(task_id, False,
    Unloadable)`` (for a grouped message, every task of it)."""
    kind = body[:1]
    if kind == GROUPED:
        count = _COUNT.unpack_from(body, 1)[0]
        start = 1 + _COUNT.size + 8 * count
        try:
            return serialization.loads(body[start:])
        except BaseException as exc:  # noqa: BLE001 - numpy missing here, or broken
            ids = array.array("Q")
            ids.frombytes(body[1 + _COUNT.size:start])
            return [(task_id, False, Unloadable(exc)) for task_id in ids]
    if kind != FRAMED:
        return serialization.loads(body)
    count = _COUNT.unpack_from(body, 1)[0]
    head = 1 + _COUNT.size
    offset = head + count * _ITEM.size
    results: Results = []
    for i in range(count):
        task_id, ok, size = _ITEM.unpack_from(body, head + i * _ITEM.size)
        view = body[offset:offset + size]
        offset += size
        if not ok:
            results.append((task_id, False, bytes(view)))
            continue
        try:
            results.append((task_id, True, serialization.loads(view)))
        except BaseException as exc:  # noqa: BLE001 - a value's loading runs user code
            results.append((task_id, False, Unloadable(exc)))
    return results


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
