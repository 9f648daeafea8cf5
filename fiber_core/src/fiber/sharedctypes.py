"""ctypes objects in shared memory, as :mod:`multiprocessing.sharedctypes`:
:func:`RawValue`, :func:`RawArray`, :func:`Value`, :func:`Array`, :func:`copy`,
:func:`synchronized` and the wrappers :class:`Synchronized`,
:class:`SynchronizedArray` and :class:`SynchronizedString`.

A raw object is a ctypes object over a block of ``/dev/shm`` that its creating
process made (:class:`fiber.runtime.shared.buffers.SharedBuffer`); ``Value`` and
``Array`` wrap one with a lock (``lock=True``: a new :func:`fiber.synchronize.RLock`;
``lock=False``: the raw object itself; any object with ``acquire``: that lock), as
multiprocessing does: ``get_obj()``, ``get_lock()``, ``acquire``/``release``, ``with``,
``.value``, indexing and slicing, ``.raw``/``.value`` of char arrays, the same reprs.

**Passing one to another process.** The objects pickle by reference (a raw ctypes
object through a reducer registered with :mod:`copyreg` for each ctypes type this
module makes objects of; other objects of that type keep their usual pickling), at
any time: as an argument of a Process or a Pool task, in a Queue or a Pipe. The
pickle carries the block's name, the creator's host (:func:`fiber.wire.shm.host_token`)
and a token of the object in the creator's server (:mod:`fiber.runtime.shared.served`).
The receiving process then

* on the creator's host: maps the same block and gets an object of the same class as
  the creator's (a ctypes object, a ``Synchronized`` wrapper over one and the lock
  as it pickled itself): a write in one process is seen by the other at once;
* on another host (or with the ``shared_memory`` setting off,
  ``FIBER_SHARED_MEMORY=false``): gets a proxy whose every operation (``.value``, an
  item, a slice, a field, ``acquire``...) is one round trip to the creator, which runs
  it on its own object (under the object's lock for a synchronized one, as its
  wrapper does). ``get_lock()`` of such a proxy is a proxy of the creator's lock,
  served by the same thread of the creator as the object's operations, so ``with
  v.get_lock(): v.value += 1`` holds the lock across both. ``get_obj()`` (and an item
  or a field that is a structure or an array) is a proxy of the same kind without
  the lock: it has the ctypes object's ``.value``, fields and indexing, but it is not
  a ctypes object (no ``ctypes.addressof``, ``pointer``, ``memoryview`` over local
  memory), since there is no local memory to point to. When the creator is gone, the
  next operation raises :class:`fiber.ConnectionLostError`.

The creator keeps an object it has pickled (and its block) as long as it lives: a
pickle in flight cannot be counted. The block's name is unlinked when the creator
drops an object it never pickled, or at its exit, after its children were joined;
processes that mapped it keep their memory.
"""

from __future__ import annotations

import copyreg
import ctypes
import pickle
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from fiber.runtime.shared import served
from fiber.runtime.shared.buffers import SharedBuffer
from fiber.runtime.shared.ctypes_proxies import (
    RAW_TYPEID,
    SYNCHRONIZED_TYPEID,
    _RawProxy,
    _Served,
    _SynchronizedProxy,
)
from fiber.runtime.shared.ctypes_proxies import (
    layout as _layout,
)
from fiber.wire import auth, shm

__all__ = ["RawValue", "RawArray", "Value", "Array", "copy", "synchronized"]

typecode_to_type: dict[str, type] = {
    "c": ctypes.c_char, "u": ctypes.c_wchar,
    "b": ctypes.c_byte, "B": ctypes.c_ubyte,
    "h": ctypes.c_short, "H": ctypes.c_ushort,
    "i": ctypes.c_int, "I": ctypes.c_uint,
    "l": ctypes.c_long, "L": ctypes.c_ulong,
    "q": ctypes.c_longlong, "Q": ctypes.c_ulonglong,
    "f": ctypes.c_float, "d": ctypes.c_double,
}

# --- the native objects --------------------------------------------------------------


class _Ref:
    """What a shared ctypes object carries (as its ``_fiber_ref`` attribute): how
    another process finds it."""

    __slots__ = ("desc", "buffer", "host", "token", "served")

    def __init__(self, desc: Any, buffer: SharedBuffer, host: bytes | None,
                 token: Any = None) -> None:
        self.desc, self.buffer, self.host, self.token = desc, buffer, host, token
        self.served: _Served | None = None


_registered: set[type] = set()
_register_lock = threading.Lock()
# the blocks this process created or mapped, by name: a block received again is not
# mapped again
_buffers: weakref.WeakValueDictionary[str, SharedBuffer] = weakref.WeakValueDictionary()


def _describe(ctype: Any) -> Any:
    """``ctype`` as it travels in a pickle: the type itself, an array type as its
    element and length (array types have no importable name), a type of the main
    script by name (the receiving job has imported that script as ``__main__``)."""
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
        return ("array", _describe(ctype._type_), ctype._length_)
    if getattr(ctype, "__module__", None) in ("__main__", "__mp_main__"):
        return ("main", ctype.__qualname__)
    return ctype


def _undescribe(desc: Any) -> Any:
    if not isinstance(desc, tuple):
        return desc
    if desc[0] == "array":
        return _undescribe(desc[1]) * desc[2]
    found: Any = sys.modules["__main__"]
    for part in desc[1].split("."):
        found = getattr(found, part)
    return found


def _mark(obj: Any, ref: _Ref) -> Any:
    """Make ``obj`` pickle by reference (registering its type's reducer once)."""
    cls = type(obj)
    if cls not in _registered:
        with _register_lock:
            copyreg.pickle(cls, _reduce_ctype)
            _registered.add(cls)
    obj._fiber_ref = ref
    obj._wrapper = _StdlibWrapper(ref.buffer)
    return obj


class _StdlibWrapper:
    """What multiprocessing's own reducer of ctypes objects needs of a shared one
    (``obj._wrapper``): once a process has made a ``multiprocessing.sharedctypes``
    object, multiprocessing's pickler, used to start its children, reduces every object
    of that ctypes type with its own reducer, fiber's objects too; it then pickles this
    wrapper, which the child maps again by name (a standard-library child runs on this
    host), so the child shares the same memory either way."""

    def __init__(self, buffer: SharedBuffer) -> None:
        self.buffer = buffer

    def create_memoryview(self) -> memoryview:
        return memoryview(self.buffer.map)

    def __reduce__(self) -> tuple[Any, ...]:
        return _attach_stdlib_wrapper, (self.buffer.name, self.buffer.size)


def _attach_stdlib_wrapper(name: str, size: int) -> _StdlibWrapper:
    buffer = _buffers.get(name)
    if buffer is None:
        buffer = SharedBuffer.attach(name, size)
        _buffers[name] = buffer
    return _StdlibWrapper(buffer)


def _new_value(ctype: Any) -> Any:
    """A zeroed object of ``ctype`` over a new shared block."""
    buffer = SharedBuffer(ctypes.sizeof(ctype))
    _buffers[buffer.name] = buffer
    obj = ctype.from_buffer(buffer.map)
    return _mark(obj, _Ref(_describe(ctype), buffer, shm.host_token()))


def _ctype(typecode_or_type: Any) -> Any:
    """The ctypes type a typecode names (anything else is taken as a type)."""
    table: dict[Any, Any] = typecode_to_type
    return table.get(typecode_or_type, typecode_or_type)


def RawValue(typecode_or_type: str | type, *args: Any) -> Any:
    """A ctypes object of ``typecode_or_type`` in shared memory, initialized with
    ``args`` (zeroed without)."""
    obj = _new_value(_ctype(typecode_or_type))
    obj.__init__(*args)
    return obj


def RawArray(typecode_or_type: str | type, size_or_initializer: int | Sequence[Any]) -> Any:
    """A ctypes array in shared memory: ``size`` zeroed items, or the items of the
    initializer."""
    ctype = _ctype(typecode_or_type)
    if isinstance(size_or_initializer, int):
        return _new_value(ctype * size_or_initializer)
    obj = _new_value(ctype * len(size_or_initializer))
    obj.__init__(*size_or_initializer)
    return obj


def _lock_for(lock: Any, ctx: Any) -> Any:
    if lock in (True, None):
        if ctx is not None:
            return ctx.RLock()
        from fiber import synchronize  # an API module of the same layer

        return synchronize.RLock()
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    return lock


def Value(typecode_or_type: str | type, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A :func:`RawValue` with a lock (:func:`synchronized`); ``lock=False``: the raw
    value."""
    obj = RawValue(typecode_or_type, *args)
    if lock is False:
        return obj
    return synchronized(obj, _lock_for(lock, ctx), ctx=ctx)


def Array(typecode_or_type: str | type, size_or_initializer: int | Sequence[Any], *,
          lock: Any = True, ctx: Any = None) -> Any:
    """A :func:`RawArray` with a lock (:func:`synchronized`); ``lock=False``: the raw
    array."""
    obj = RawArray(typecode_or_type, size_or_initializer)
    if lock is False:
        return obj
    return synchronized(obj, _lock_for(lock, ctx), ctx=ctx)


def copy(obj: Any) -> Any:
    """A new shared object with the type and the contents of ctypes object ``obj``."""
    new = _new_value(type(obj))
    ctypes.pointer(new)[0] = obj
    return new


def _kind(obj: Any) -> str:
    """``"simple"``, ``"string"`` (char array), ``"array"`` or ``"struct"``, for a
    ctypes object or a proxy of one."""
    if isinstance(obj, _RawProxy):
        layout = obj._layout()
        if layout[0] == "array":
            return "string" if layout[3] else "array"
        return str(layout[0])
    if isinstance(obj, ctypes._SimpleCData):
        return "simple"
    if isinstance(obj, ctypes.Array):
        return "string" if obj._type_ is ctypes.c_char else "array"
    return "struct"


def synchronized(obj: Any, lock: Any = None, ctx: Any = None) -> Any:
    """``obj`` (a ctypes object) wrapped with ``lock`` (a new RLock if None): a
    :class:`Synchronized`, :class:`SynchronizedArray`, :class:`SynchronizedString`,
    or for a structure a ``Synchronized<Name>`` with a property per field."""
    if isinstance(obj, SynchronizedBase):
        raise AssertionError("object already synchronized")
    kind = _kind(obj)
    if kind == "simple":
        return Synchronized(obj, lock, ctx)
    if kind == "string":
        return SynchronizedString(obj, lock, ctx)
    if kind == "array":
        return SynchronizedArray(obj, lock, ctx)
    cls = type(obj)
    wrapper = _struct_wrappers.get(cls)
    if wrapper is None:
        names = obj._layout()[1] if isinstance(obj, _RawProxy) else _field_names(cls)
        attrs = {name: _locked_field(name) for name in names}
        wrapper = type("Synchronized" + cls.__name__, (SynchronizedBase,), attrs)
        if not isinstance(obj, _RawProxy):
            _struct_wrappers[cls] = wrapper
    return wrapper(obj, lock, ctx)


def _field_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for field in klass.__dict__.get("_fields_", ()):
            names.append(field[0])
    return names


def _locked_field(name: str) -> property:
    def get(self: SynchronizedBase) -> Any:
        with self._lock:
            return getattr(self._obj, name)

    def set(self: SynchronizedBase, value: Any) -> None:
        with self._lock:
            setattr(self._obj, name, value)

    return property(get, set)


_struct_wrappers: weakref.WeakKeyDictionary[type, type] = weakref.WeakKeyDictionary()


class SynchronizedBase:
    """A shared ctypes object and the lock that guards each access to it."""

    def __init__(self, obj: Any, lock: Any = None, ctx: Any = None) -> None:
        self._obj = obj
        self._lock = lock if lock else _lock_for(True, ctx)
        self.acquire = self._lock.acquire
        self.release = self._lock.release

    def __enter__(self) -> Any:
        return self._lock.__enter__()

    def __exit__(self, *args: Any) -> Any:
        return self._lock.__exit__(*args)

    def get_obj(self) -> Any:
        """The ctypes object."""
        return self._obj

    def get_lock(self) -> Any:
        """The lock."""
        return self._lock

    def __repr__(self) -> str:
        return f"<{type(self).__name__} wrapper for {self._obj}>"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        ref = _ref_of(self._obj)
        if ref is None:  # a wrapper over a proxy, or over memory that is not shared
            if not isinstance(self._obj, _RawProxy):
                raise TypeError(f"{self!r} wraps an object that is not in shared memory: "
                                "make it with sharedctypes.RawValue/RawArray/copy")
            return synchronized, (self._obj, self._lock)
        token = self.__dict__.get("_fiber_token")
        if token is None:
            adapter = _Served(self._obj, self)
            token = self._fiber_token = served.token_for(adapter, SYNCHRONIZED_TYPEID)
        return _rebuild_synchronized, (ref.desc, ref.buffer.name, ref.host, token,
                                       _layout(type(self._obj)), self._lock,
                                       auth.for_stdlib_child())


def _under_lock(name: str) -> property:
    """A property that reads and writes the wrapped object's attribute ``name`` under
    the wrapper's lock (``.value``, ``.raw``)."""

    def get(self: SynchronizedBase) -> Any:
        with self._lock:
            return getattr(self._obj, name)

    def set_(self: SynchronizedBase, value: Any) -> None:
        with self._lock:
            setattr(self._obj, name, value)

    return property(get, set_, doc=f"The object's ``{name}``, under the lock.")


class Synchronized(SynchronizedBase):
    """A synchronized simple value: ``.value`` under the lock."""

    value = _under_lock("value")


class SynchronizedArray(SynchronizedBase):
    """A synchronized array: ``len``, items and slices under the lock."""

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, index: int | slice) -> Any:
        with self._lock:
            return self._obj[index]

    def __setitem__(self, index: int | slice, value: Any) -> None:
        with self._lock:
            self._obj[index] = value


class SynchronizedString(SynchronizedArray):
    """A synchronized char array: also ``.value`` and ``.raw`` under the lock."""

    value = _under_lock("value")
    raw = _under_lock("raw")


# --- pickling ----------------------------------------------------------------------


def _ref_of(obj: Any) -> _Ref | None:
    try:
        return obj.__dict__.get("_fiber_ref")
    except AttributeError:
        return None


def _reduce_ctype(obj: Any) -> Any:
    """The reducer of the ctypes types this module made objects of: a shared object
    by reference, any other by its usual reduction (by value)."""
    ref = _ref_of(obj)
    if ref is None:
        return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
    if ref.token is None:
        with _register_lock:
            if ref.served is None:
                ref.served = _Served(obj, None)
        ref.token = served.token_for(ref.served, RAW_TYPEID)
    return _rebuild_raw, (ref.desc, ref.buffer.name, ref.host, ref.token,
                          _layout(type(obj)), auth.for_stdlib_child())


def _local(host: bytes | None) -> bool:
    return host is not None and host == shm.host_token()


def _attach(desc: Any, name: str, host: bytes | None, token: Any) -> Any:
    ctype = _undescribe(desc)
    buffer = _buffers.get(name)
    if buffer is None:
        buffer = SharedBuffer.attach(name, ctypes.sizeof(ctype))
        _buffers[name] = buffer
    return _mark(ctype.from_buffer(buffer.map), _Ref(desc, buffer, host, token))


def _rebuild_raw(desc: Any, name: str, host: bytes | None, token: Any,
                 layout: tuple, secret: bytes | None = None) -> Any:
    """Unpickle a raw object: mapped on the creator's host, else a proxy. ``secret``:
    the run's, for a child started by multiprocessing."""
    auth.adopt(secret)
    if _local(host):
        return _attach(desc, name, host, token)
    proxy = served.proxy_of(token)
    proxy._fiber_layout = layout
    proxy._fiber_reduce = (_rebuild_raw, (desc, name, host, token, layout))
    return proxy


def _rebuild_synchronized(desc: Any, name: str, host: bytes | None, token: Any,
                          layout: tuple, lock: Any, secret: bytes | None = None) -> Any:
    """Unpickle a synchronized object: a wrapper of the creator's class over the
    mapped block on its host, else a proxy. ``secret``: the run's, for a child started
    by multiprocessing."""
    auth.adopt(secret)
    if _local(host):
        wrapper = synchronized(_attach(desc, name, host, token=None), lock)
        wrapper._fiber_token = token
        return wrapper
    proxy = served.proxy_of(token)
    proxy._fiber_layout = layout
    proxy._fiber_reduce = (_rebuild_synchronized, (desc, name, host, token, layout, lock))
    return proxy


def shared_path(obj: Any) -> str:
    """fiber extension: which path the shared object ``obj`` takes in this process:
    ``"native"`` (this host's shared memory, mapped here) or ``"creator"`` (a proxy:
    each access goes through the process that created it). The same question
    :func:`fiber.synchronize.shared_path` answers for locks; tests and diagnostics ask
    it. Raises TypeError for an object that is not of :mod:`fiber.sharedctypes`."""
    if isinstance(obj, _RawProxy):
        return "creator"
    if isinstance(obj, SynchronizedBase):
        obj = obj.get_obj()
        if isinstance(obj, _RawProxy):
            return "creator"
    if _ref_of(obj) is None:
        raise TypeError(f"{obj!r} is not a shared object of fiber.sharedctypes")
    return "native"


served.register(RAW_TYPEID, _RawProxy)
served.register(SYNCHRONIZED_TYPEID, _SynchronizedProxy)
