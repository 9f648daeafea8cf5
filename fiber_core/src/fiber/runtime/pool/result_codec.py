"""How a pool worker's results travel to the master, so that a result that cannot
travel fails its own task and nothing else, at the old cost.

A message (``PARTIAL`` or ``RESULTS``) carries ``[(task_id, ok, value), ...]``, where a
failure's value is a packed exception (bytes). :meth:`ResultEncoder.encode` (worker)
writes it as ONE pickle of that list, as any fiber message (big buffers out of band,
:func:`fiber.wire.serialization.dumps`' layout), with the C pickler. Its
``reducer_override`` (called only for objects that are not exact ``int``, ``float``,
``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set``, ...: plain data costs
nothing) sorts the others:

* builtins (``len``, ``range``, ``complex``, ...) stay inline: they load anywhere;
* numpy's scalars, dtypes and arrays stay inline too (their pickles share one copy of
  their classes; one by one a numpy scalar costs ten times as much), and the message
  is *grouped*: the tasks' ids go in front, so that should it not load in the master
  (numpy missing there) each of its tasks fails, named;
* any other object (an instance of a user class, a function, a class) is pickled on
  its own, by pickle or else cloudpickle, and stands in the message as
  ``pickle.loads(its pickle)`` (C, no Python frame when it loads), its big buffers
  out of band.

The master (:func:`decode`) loads the message in one ``pickle.loads``, as before. Only
if that raises (a class missing in the master, a ``__reduce__`` callable or
``__setstate__`` that raises) it loads it again, with an unpickler that runs each
nested pickle under ``try``: one that raises becomes an :class:`Unloadable` outcome of
the task whose value holds it, the others are delivered.

A worker's results are mostly of one kind, so the encoder remembers which attempt
failed: after a message that was not plain data it streams the next ones at once, and
after one that pickle could not do it streams with cloudpickle at once (a class of the
script's ``__main__`` is one, in a worker), trying the faster way again every
``_RETRY`` messages; without that, each message paid for two or three failed attempts
(43% fewer dataclass results per second than plain pickling in ``bench``-like runs).

A value the worker cannot pickle at all (nor cloudpickle) makes the one pickle raise;
the worker then encodes each result alone, and those that fail fail their task with
multiprocessing's ``MaybeEncodingError`` (:func:`unpicklable`), built from a bounded
``repr``, so a value whose ``repr`` raises (``RecursionError`` for a deeply nested
list) or is huge costs neither the worker nor the message. A task never fails as a
lost worker for its result's sake.
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

import cloudpickle

from fiber.errors import ResultUnpicklingError, SerializationError
from fiber.wire import serialization

logger = logging.getLogger("fiber")

#: the first byte of a grouped message body (a plain one starts with a pickle's b"\x80"
#: or :mod:`fiber.wire.serialization`'s b"\x01"/b"\x02")
GROUPED = b"\x11"  # the one pickle behind the tasks' ids
STREAMED = b"\x12"  # one pickle per result, one memo
_COUNT = struct.Struct("<I")

Results = list[tuple[int, bool, Any]]

#: after a message needed a slower layout, how many the encoder sends that way before
#: it tries the faster one again
_RETRY = 64

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


class _ListPickler(pickle.Pickler):
    """The C pickler for the one pickle of plain data, builtins and numpy's objects:
    stops at any other object (see the module's docstring)."""

    def __init__(self, file: Any, buffer_callback: Callable[[Any], Any] | None) -> None:
        super().__init__(file, serialization.PROTOCOL, buffer_callback=buffer_callback)
        self.trusted = False  # an object of numpy's was pickled

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        module: Any = cls.__module__
        if module == "builtins":  # a class or a function: its own module
            module = getattr(obj, "__module__", module)
            if module == "builtins":
                return NotImplemented
        if isinstance(module, str) and (module == "numpy" or module.startswith("numpy.")):
            self.trusted = True
            return NotImplemented
        raise _NotPlain


class ResultEncoder:
    """Encodes the results of one worker's messages (one encoder per thread that
    sends: its picklers and buffer are reused)."""

    def __init__(self) -> None:
        self._file = io.BytesIO()
        self._buffers: list[pickle.PickleBuffer] = []
        self._list = _ListPickler(self._file, self._buffers.append)
        self._inband: _ListPickler | None = None  # made when first needed
        self._stream = pickle.Pickler(self._file, serialization.PROTOCOL,
                                      buffer_callback=self._buffers.append)
        self._cloud: Any = None  # the cloudpickle stream pickler, made when first needed
        # A worker's results are mostly of one kind: once a message needed the streamed
        # layout (or cloudpickle), the next ones start there, skipping the attempts that
        # would fail again; the list (or pickle) is tried again every _RETRY messages
        self._skip_list = 0
        self._skip_pickle = 0

    def encode(self, results: Results, head: bytes = b"") -> bytes:
        """``head`` and the body of a message carrying ``results``."""
        if self._skip_list:
            self._skip_list -= 1
            return self._streamed(results, head)
        try:
            data = self._dump(self._list, results)
        except Exception:  # noqa: BLE001 - _NotPlain, or what pickle cannot do (deep data)
            self._skip_list = _RETRY
            return self._streamed(results, head)
        trusted = self._list.trusted
        if self._buffers:
            big = [b.raw() for b in self._buffers]
            if sum(m.nbytes for m in big) >= serialization.OOB_THRESHOLD:
                data = serialization.with_buffers(data, big)
            else:  # small arrays: in band, as fiber.wire.serialization.dumps does
                if self._inband is None:
                    self._inband = _ListPickler(self._file, None)
                data = self._dump(self._inband, results)
            self._buffers.clear()
        if not trusted:
            return head + data
        ids = array.array("Q", [r[0] for r in results])
        return b"".join([head, GROUPED, _COUNT.pack(len(ids)), ids.tobytes(), data])

    def _dump(self, pickler: Any, obj: Any) -> bytes:
        file = self._file
        file.seek(0)
        file.truncate()
        self._buffers.clear()
        try:
            pickler.dump(obj)
        finally:
            pickler.clear_memo()  # drop the references to the values
        return file.getvalue()

    def _streamed(self, results: Results, head: bytes) -> bytes:
        """The streamed layout: one pickle per result, one memo."""
        data = None
        if self._skip_pickle:
            self._skip_pickle -= 1
        else:
            try:
                data = self._stream_dump(self._stream, results)
            except Exception:  # noqa: BLE001 - a value only cloudpickle can do, or none
                self._skip_pickle = _RETRY
        if data is None:
            try:
                data = self._stream_dump(self._cloudpickler(), results)
            except Exception:  # noqa: BLE001 - a value that nothing can pickle
                results, pickler = self._sendable(results)
                data = self._stream_dump(pickler, results)
        if self._buffers:
            data = serialization.with_buffers(data, [b.raw() for b in self._buffers])
            self._buffers.clear()
        return b"".join([head, STREAMED, _COUNT.pack(len(results)), data])

    def _stream_dump(self, pickler: Any, results: Results) -> bytes:
        file = self._file
        file.seek(0)
        file.truncate()
        self._buffers.clear()
        dump = pickler.dump
        try:
            for result in results:
                dump(result)
        finally:
            pickler.clear_memo()
        return file.getvalue()

    def _sendable(self, results: Results) -> tuple[Results, Any]:
        """``results`` with each value that neither pickle nor cloudpickle can do
        replaced by the failure of its task, and the pickler to stream them with."""
        out: Results = []
        by_value = False
        for result in results:
            task_id, ok, value = result
            if ok:
                try:
                    pickle.dumps(value, serialization.PROTOCOL, buffer_callback=_discard)
                except Exception:  # noqa: BLE001 - perhaps cloudpickle can
                    try:
                        serialization.pickle_object(value, [])
                        by_value = True
                    except Exception as exc:  # noqa: BLE001 - the task fails, not the worker
                        result = task_id, False, serialization.pack_exception(
                            unpicklable(exc, value))
            out.append(result)
        return out, self._cloudpickler() if by_value else self._stream

    def _cloudpickler(self) -> Any:
        if self._cloud is None:
            self._cloud = cloudpickle.Pickler(self._file, serialization.PROTOCOL,
                                              buffer_callback=self._buffers.append)
        return self._cloud


def _discard(buffer: Any) -> None:
    pass


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
    """Loads a stream again, an opcode that raises (running a value's code) making a
    :class:`_Failed` in its place, so that the memo stays in step with the pickler's
    and each result loads or fails on its own; ``failures`` records what raised."""

    dispatch = dict(_Base.dispatch)

    def __init__(self, file: Any, buffers: Any) -> None:
        super().__init__(file, buffers=buffers)
        self.failures: list[BaseException] = []

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except Exception as exc:  # noqa: BLE001 - a class missing here
            self.failures.append(exc)
            return _Failed(exc)


def _replacing_top(op: Callable[[Any], None]) -> Callable[[Any], None]:
    def guarded(self: _GuardedUnpickler) -> None:
        try:
            op(self)
        except Exception as exc:  # noqa: BLE001 - a value's code raised
            self.failures.append(exc)
            self.stack[-1] = _Failed(exc)
    return guarded


def _popping(op: Callable[[Any], None], count: int) -> Callable[[Any], None]:
    def guarded(self: _GuardedUnpickler) -> None:
        depth = len(self.stack) - count
        try:
            op(self)
        except Exception as exc:  # noqa: BLE001 - a value's code raised
            self.failures.append(exc)
            del self.stack[depth:]
            self.stack.append(_Failed(exc))
    return guarded


def _getting(op: Callable[[Any], None]) -> Callable[[Any], None]:
    def guarded(self: _GuardedUnpickler) -> None:
        op(self)
        if type(self.stack[-1]) is _Failed:  # what failed in an earlier result
            self.failures.append(self.stack[-1].exc)
    return guarded


for _code in (pickle.REDUCE, pickle.BUILD, pickle.APPEND, pickle.APPENDS, pickle.SETITEM,
              pickle.SETITEMS, pickle.ADDITEMS):
    _GuardedUnpickler.dispatch[_code[0]] = _replacing_top(_Base.dispatch[_code[0]])
for _code, _count in ((pickle.NEWOBJ, 2), (pickle.NEWOBJ_EX, 3)):
    _GuardedUnpickler.dispatch[_code[0]] = _popping(_Base.dispatch[_code[0]], _count)
for _code in (pickle.GET, pickle.BINGET, pickle.LONG_BINGET):
    _GuardedUnpickler.dispatch[_code[0]] = _getting(_Base.dispatch[_code[0]])


def _stream_loader(count: int) -> Callable[..., Results]:
    def load(data: Any, buffers: Any = None) -> Results:
        unpickler = pickle.Unpickler(io.BytesIO(data), buffers=buffers)
        try:
            return [unpickler.load() for _ in range(count)]
        except BaseException:  # noqa: BLE001 - a value's loading runs user code
            pass
        guarded = _GuardedUnpickler(io.BytesIO(data), buffers)
        results: Results = []
        for _ in range(count):
            before = len(guarded.failures)
            result = guarded.load()
            if len(guarded.failures) > before:
                result = result[0], False, Unloadable(guarded.failures[before])
            results.append(result)
        return results
    return load


def decode(body: memoryview) -> Results:
    """The results of a message body (:meth:`ResultEncoder.encode`). Never raises for
    a value: one that cannot be unpickled here comes as ``(task_id, False,
    Unloadable)`` (for a grouped message that will not load, every task of it)."""
    kind = body[:1]
    if kind == STREAMED:
        count = _COUNT.unpack_from(body, 1)[0]
        return serialization.loads(body[1 + _COUNT.size:], _stream_loader(count))
    if kind != GROUPED:
        return serialization.loads(body)
    count = _COUNT.unpack_from(body, 1)[0]
    start = 1 + _COUNT.size + 8 * count
    try:
        return serialization.loads(body[start:])
    except BaseException as exc:  # noqa: BLE001 - numpy missing here, or broken
        ids = array.array("Q")
        ids.frombytes(body[1 + _COUNT.size:start])
        return [(task_id, False, Unloadable(exc)) for task_id in ids]


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
