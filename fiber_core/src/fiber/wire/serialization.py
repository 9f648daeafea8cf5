"""Turning objects into bytes and back for the wire.

``dumps``/``loads`` use the standard pickle (fast, by reference) and fall back to
cloudpickle for what pickle cannot do (lambdas, closures, functions and classes of an
interactive ``__main__``). ``dumps_code`` always uses cloudpickle (process objects,
task functions), which pickles ``__main__`` code by value. Large buffers (pickle
protocol 5, e.g. numpy arrays) travel out of band: they are not copied into the
pickle stream, only once into the message. Queues and pipes pass a ``shared`` callback: large
buffers then go through a shared-memory segment (:mod:`fiber.wire.shm`) when the mailbox
is on this host, and the message is a small descriptor (a :class:`Shared`).
"""

from __future__ import annotations

import collections
import io
import linecache
import pickle
import re
import socket
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any

import cloudpickle

from fiber.errors import RemoteError, SerializationError
from fiber.wire import handles, shm
from fiber.wire.protocol import BODY_LENGTH as _LEN
from fiber.wire.protocol import BODY_OUT_OF_BAND as _OOB
from fiber.wire.protocol import BODY_SHARED as _SHM

PROTOCOL = 5
OOB_THRESHOLD = 64 * 1024


# cloudpickle's reduction of a code object names its file "<dynamic-code>" (for payloads
# that do not depend on where the code was defined): a traceback through a function
# sent by value then has no source line. fiber's pickler keeps the real file name, so
# the receiver's linecache finds the file when it has it, and the parent fills in the
# lines the other side could not (see unpack_exception).
_DYNAMIC_CODE = "<dynamic-code>"
_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]


def _code_reduce(code: types.CodeType) -> Any:
    constructor, args = _cloudpickle_code_reduce(code)
    return constructor, tuple(code.co_filename
                              if type(arg) is str and arg == _DYNAMIC_CODE else arg
                              for arg in args)


class _CodePickler(cloudpickle.Pickler):
    """cloudpickle's pickler, keeping the file names of the code it sends by value, and
    sending sockets as handles (:mod:`fiber.wire.handles`: duplicated into a receiver
    of the same kernel, refused elsewhere; the standard pickle refuses a socket, so a
    message holding one comes here)."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce,
                                           socket.socket: handles.reduce_socket},
                                          cloudpickle.Pickler.dispatch_table)


def _cloudpickle_dumps(obj: Any, buffer_callback: Callable[[Any], Any] | None = None) -> bytes:
    file = io.BytesIO()
    _CodePickler(file, PROTOCOL, buffer_callback=buffer_callback).dump(obj)
    return file.getvalue()


class Shared(bytes):
    """A message whose buffers are in a shared-memory segment: the segment must be
    unlinked by whoever drops the message (see :func:`discard`)."""

    __slots__ = ()


def pickle_object(obj: Any, buffers: list | None = None) -> bytes:
    """One pickle of ``obj`` by pickle, else by cloudpickle (``buffers``, when given,
    receives its out-of-band buffers); :class:`~fiber.errors.SerializationError` when
    neither can."""
    return _pickle(obj, buffers)


def _pickle(obj: Any, buffers: list | None) -> bytes:
    callback = None if buffers is None else buffers.append
    try:
        return pickle.dumps(obj, PROTOCOL, buffer_callback=callback)
    except Exception:  # noqa: BLE001 - any pickling failure falls back to cloudpickle
        if buffers is not None:
            buffers.clear()
    try:
        return _cloudpickle_dumps(obj, callback)
    except Exception as exc:  # noqa: BLE001
        raise SerializationError(
            f"cannot send {type(obj).__name__} object to another process: {exc}. "
            "Objects sent between fiber processes must be picklable (by pickle or "
            "cloudpickle); open files, sockets, locks and generators are not."
        ) from exc


def dumps(obj: Any, shared: Callable[[], int | None] | None = None) -> bytes:
    """Serialize ``obj`` into one message body (out-of-band buffers appended).

    ``shared`` (queues and pipes) returns the pid of the process holding the
    destination mailbox when it is on this host, else None; it is called only for
    messages with at least :data:`fiber.wire.shm.THRESHOLD` bytes of buffers, which then
    go into a shared-memory segment and the result is a :class:`Shared`."""
    buffers: list[pickle.PickleBuffer] = []
    data = _pickle(obj, buffers)
    if not buffers:
        return data  # (most messages: nothing out of band)
    big = [b.raw() for b in buffers]
    total = sum(m.nbytes for m in big)
    if total < OOB_THRESHOLD:
        return _pickle(obj, None)
    if shared is not None and total >= shm.THRESHOLD:
        owner = shared()
        segment = shm.write(owner, big) if owner is not None else None
        if segment is not None:
            name, offsets = segment
            header = [_SHM, _LEN.pack(len(big)), _LEN.pack(len(data)),
                      _LEN.pack(len(name)), name.encode()]
            header += [_LEN.pack(o) + _LEN.pack(m.nbytes) for o, m in zip(offsets, big, strict=True)]
            return Shared(b"".join([*header, data]))
    return with_buffers(data, big)


def with_buffers(data: bytes, big: list[memoryview]) -> bytes:
    """The body of a message whose pickle ``data`` has the out-of-band buffers ``big``
    (raw views), appended to it (:func:`loads` reads it)."""
    header = [_OOB, _LEN.pack(len(big)), _LEN.pack(len(data))]
    header += [_LEN.pack(m.nbytes) for m in big]
    return b"".join([*header, data, *big])


def _malformed(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"a malformed message body: {what}")


def _parse_shared(view: memoryview) -> tuple[str, list[tuple[int, int]], memoryview]:
    """The segment's name, the buffers' (offset, size) in it and the pickle of a
    shared-memory descriptor; :class:`pickle.UnpicklingError` when it is not one."""
    if len(view) < 25:
        raise _malformed("a shared-memory descriptor cut short")
    count, size, namelen = (_LEN.unpack_from(view, 1 + 8 * i)[0] for i in range(3))
    offset = 25 + namelen
    if count == 0 or offset + 16 * count + size > len(view):
        raise _malformed("a shared-memory descriptor whose sizes do not fit it")
    try:
        name = bytes(view[25:offset]).decode()
    except UnicodeDecodeError:
        raise _malformed("a shared-memory segment name that is not UTF-8") from None
    spans = [(_LEN.unpack_from(view, offset + 16 * i)[0],
              _LEN.unpack_from(view, offset + 16 * i + 8)[0]) for i in range(count)]
    offset += 16 * count
    return name, spans, view[offset:offset + size]


def _parse_oob(view: memoryview) -> tuple[memoryview, list[memoryview]]:
    """The pickle and the buffers of a message with buffers appended;
    :class:`pickle.UnpicklingError` when it is not one."""
    if len(view) < 17:
        raise _malformed("a header cut short")
    count = _LEN.unpack_from(view, 1)[0]
    offset = 9 + 8 * (count + 1)
    if offset > len(view):
        raise _malformed("more buffers announced than the body holds")
    sizes = [_LEN.unpack_from(view, 9 + 8 * i)[0] for i in range(count + 1)]
    if offset + sum(sizes) > len(view):
        raise _malformed("sizes beyond the end of the body")
    parts = []
    for size in sizes:
        parts.append(view[offset:offset + size])
        offset += size
    return parts[0], parts[1:]


def _attach(view: memoryview) -> tuple[list[memoryview], memoryview]:
    name, spans, data = _parse_shared(view)
    mapping = memoryview(shm.attach(name, max(o + n for o, n in spans)))
    return [mapping[o:o + n] for o, n in spans], data


def is_shared(body: bytes | memoryview) -> bool:
    """Whether ``body`` is a shared-memory descriptor (see :func:`dumps`)."""
    return isinstance(body, Shared) or memoryview(body)[:1] == _SHM


def discard(body: bytes | memoryview) -> None:
    """A message that will never be received: unlink its segment, if any (a malformed
    descriptor names none)."""
    if isinstance(body, Shared):
        try:
            name = _parse_shared(memoryview(body))[0]
        except pickle.UnpicklingError:
            return
        shm.drop(name)


def inline(body: bytes | memoryview) -> bytes:
    """The plain message (buffers appended) of a shared-memory descriptor, for a
    receiver that cannot map the segment; the segment is unlinked."""
    buffers, data = _attach(memoryview(body))
    header = [_OOB, _LEN.pack(len(buffers)), _LEN.pack(len(data))]
    header += [_LEN.pack(m.nbytes) for m in buffers]
    return b"".join([*header, data, *buffers])


def loads(body: bytes | memoryview,
          load: Callable[..., Any] = pickle.loads) -> Any:
    """Inverse of :func:`dumps`. The arrays of a shared-memory message are backed by
    the segment's mapping (writable, private to the receiver: it was unlinked).

    Raises :class:`pickle.UnpicklingError` when the body's framing (the header of a
    message with buffers appended or in shared memory) is malformed,
    :class:`~fiber.wire.shm.SegmentError` when its segment cannot be opened, and what
    unpickling its pickle raises: only authenticated peers' messages are loaded (a
    process of the run, trusted), so that is :mod:`pickle`'s to say. ``load`` (called
    as :func:`pickle.loads` is) unpickles the pickle."""
    view = memoryview(body)
    first = view[:1]
    if first == _SHM:
        buffers, data = _attach(view)
        return load(data, buffers=buffers)
    if first != _OOB:
        return load(view)
    data, buffers = _parse_oob(view)
    # writable copies, as a multiprocessing receiver would get
    return load(data, buffers=[bytearray(b) for b in buffers])


class _OverridingPickler(_CodePickler):
    """cloudpickle's pickler with a caller's reductions tried first."""

    def __init__(self, file: Any, override: Callable[[Any], Any]) -> None:
        super().__init__(file, PROTOCOL)
        self._override = override

    def reducer_override(self, obj: Any) -> Any:
        reducer = self._override(obj)
        if reducer is not None:
            return reducer(obj)
        return super().reducer_override(obj)


def dumps_code(obj: Any, override: Callable[[Any], Any] | None = None) -> bytes:
    """Serialize code-bearing objects (targets, task functions) with cloudpickle.
    ``override(o)`` may return a reducer to use for ``o`` instead of its own."""
    try:
        if override is None:
            return _cloudpickle_dumps(obj)
        file = io.BytesIO()
        _OverridingPickler(file, override).dump(obj)
        return file.getvalue()
    except Exception as exc:  # noqa: BLE001
        raise SerializationError(
            f"cannot send {obj!r} to another process: {exc}. The target, its "
            "arguments and the objects it refers to must be picklable with cloudpickle."
        ) from exc


def loads_code(data: bytes) -> Any:
    """Inverse of :func:`dumps_code`; functions of the parent's ``__main__`` are
    bound to this process's ``__main__`` (see :func:`rebind_main`)."""
    return rebind_main(pickle.loads(data))


def rebind_main(obj: Any) -> Any:
    """cloudpickle sends functions of ``__main__`` by value, each with its own copy of
    the globals it uses, so an initializer that sets a global would not be seen by the
    tasks. As multiprocessing's spawn does, the child has imported the parent's main
    script as ``__main__``: use its function of the same name and code, or else bind
    the function to that module's namespace, so all of them share one set of globals."""
    if not isinstance(obj, types.FunctionType) or obj.__module__ != "__main__":
        return obj
    main = sys.modules.get("__main__")
    if main is None:
        return obj
    same = getattr(main, obj.__name__, None)
    if isinstance(same, types.FunctionType) and same.__code__.co_code == obj.__code__.co_code:
        return same
    namespace = main.__dict__
    for name, value in obj.__globals__.items():
        namespace.setdefault(name, value)
    rebound = types.FunctionType(obj.__code__, namespace, obj.__name__, obj.__defaults__,
                                 obj.__closure__)
    rebound.__kwdefaults__ = obj.__kwdefaults__
    rebound.__dict__.update(obj.__dict__)
    rebound.__qualname__ = obj.__qualname__
    return rebound


def pack_exception(exc: BaseException) -> bytes:
    """An exception with its traceback text, for the other side to re-raise."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        payload = pickle.dumps((exc, tb), PROTOCOL)
        pickle.loads(payload)  # some exceptions pickle but do not unpickle
        return payload
    except Exception:  # noqa: BLE001
        remote = RemoteError(type(exc).__qualname__, str(exc), tb)
        return pickle.dumps((remote, tb), PROTOCOL)


def unpack_exception(payload: bytes) -> BaseException:
    """The exception of :func:`pack_exception`, with a
    :class:`multiprocessing.pool.RemoteTraceback` (the very class, exported as
    ``fiber.pool.RemoteTraceback``) as its ``__cause__``, as multiprocessing.pool's
    results carry one, so the remote traceback is printed with it. Raises
    :class:`TypeError` when ``payload`` holds no exception, and what unpickling it
    raises (see :func:`loads`)."""
    # lazy: a failure path (5 ms once); the class is missing from typeshed
    from multiprocessing.pool import RemoteTraceback  # type: ignore[attr-defined]

    exc, tb = pickle.loads(payload)
    if not isinstance(exc, BaseException):
        raise TypeError(f"not a packed exception but a {type(exc).__name__}")
    exc.__cause__ = RemoteTraceback(f'\n"""\n{with_source_lines(tb)}"""')
    return exc


_FRAME = re.compile(r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in ')


def with_source_lines(tb: str) -> str:
    """``tb`` (a traceback's text from another process) with the source line of each
    frame that lacks one and whose file this process has (a function sent by value
    runs where its file may not exist; the process that sent it has it)."""
    lines = tb.splitlines(keepends=True)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        match = _FRAME.match(line)
        if match is None:
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if following.startswith("    "):
            continue  # the other side had the line
        source = linecache.getline(match["file"], int(match["line"])).strip()
        if source:
            out.append(f"    {source}\n")
    return "".join(out)


def is_main_module_object(obj: Any) -> bool:
    return getattr(obj, "__module__", None) == "__main__" and "__main__" in sys.modules
