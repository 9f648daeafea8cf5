"""The shared ctypes objects of :mod:`fiber.sharedctypes` through their creator.

In the creator, a :class:`_Served` adapter is what the creator's server
(:mod:`fiber.runtime.shared.served`) runs a remote process's operations on: the
ctypes object, under the lock of its ``Synchronized`` wrapper for a synchronized one.
A process of another host uses the object through a :class:`_RawProxy` (a raw object,
an item or a field that is a structure or an array, ``get_obj()``) or a
:class:`_SynchronizedProxy` (``Value``, ``Array``, ``synchronized``): each operation
is one round trip. A proxy knows the object's type by its :func:`layout` (computed
by the creator, carried in the pickle). :mod:`fiber.sharedctypes` registers the two
typeids (:data:`RAW_TYPEID`, :data:`SYNCHRONIZED_TYPEID`) with their proxies.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fiber.runtime.managers.proxies import BaseProxy
from fiber.runtime.managers.sync import LOCK_TYPEID

__all__ = ["RAW_TYPEID", "SYNCHRONIZED_TYPEID", "layout"]  # and the classes below

RAW_TYPEID = "fiber.sharedctypes.raw"
SYNCHRONIZED_TYPEID = "fiber.sharedctypes.synchronized"


def _simple_type(ctype: Any) -> bool:
    """Whether ctypes gives an item or a field of ``ctype`` as a Python value."""
    return isinstance(ctype, type) and ctypes._SimpleCData in ctype.__bases__


def layout(ctype: Any) -> tuple:
    """What a proxy needs to know of the object's type (computed by the creator)."""
    if issubclass(ctype, ctypes.Array):
        return ("array", ctype._length_, _simple_type(ctype._type_),
                ctype._type_ is ctypes.c_char, hasattr(ctype, "value"))
    if issubclass(ctype, ctypes._SimpleCData):
        return ("simple",)
    fields = {}
    for klass in reversed(ctype.__mro__):
        for field in klass.__dict__.get("_fields_", ()):
            fields[field[0]] = _simple_type(field[1])
    return ("struct", fields)


class _Served:
    """In the creator: what a proxy's operations run on (a ctypes object, and the
    wrapper whose lock guards them for a synchronized one)."""

    def __init__(self, obj: Any, wrapper: Any) -> None:
        self._obj = obj
        self._wrapper = wrapper
        self._lock = wrapper._lock if wrapper is not None else None

    def layout(self) -> tuple:
        return layout(type(self._obj))

    def _call(self, fn: Any, *args: Any) -> Any:
        if self._lock is None:
            return fn(*args)
        with self._lock:
            return fn(*args)

    def get(self) -> Any:
        return self._call(getattr, self._obj, "value")

    def set(self, value: Any) -> None:
        self._call(setattr, self._obj, "value", value)

    def get_raw(self) -> Any:
        return self._call(getattr, self._obj, "raw")

    def set_raw(self, value: Any) -> None:
        self._call(setattr, self._obj, "raw", value)

    def _field(self, name: str) -> str:
        if name not in layout(type(self._obj))[1]:
            raise AttributeError(f"{type(self._obj).__name__!r} object has no field {name!r}")
        return name

    def getfield(self, name: str) -> Any:
        return self._call(getattr, self._obj, self._field(name))

    def setfield(self, name: str, value: Any) -> None:
        self._call(setattr, self._obj, self._field(name), value)

    def field(self, name: str) -> _Served:
        return _Served(getattr(self._obj, self._field(name)), None)

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, index: int | slice) -> Any:
        return self._call(self._obj.__getitem__, index)

    def __setitem__(self, index: int | slice, value: Any) -> None:
        self._call(self._obj.__setitem__, index, value)

    def item(self, index: int) -> _Served:
        return _Served(self._obj[index], None)

    def packed_slice(self, index: slice) -> tuple[str, bytes] | list:
        """A slice of an array of numbers as (typecode, bytes): much cheaper to send
        than a list of Python numbers (the proxy unpacks it); other arrays: the list."""
        code = getattr(self._obj._type_, "_type_", None)
        if not isinstance(code, str) or code not in _PACKABLE:
            return self._call(self._obj.__getitem__, index)
        raw: Any = memoryview(self._obj).cast("B")  # Any: cast() to a code known at run time
        return code, self._call(lambda: raw.cast(code)[index].tobytes())

    def get_obj(self) -> _Served:
        return _Served(self._obj, None)

    def get_lock(self) -> Any:
        return self._lock

    def __repr__(self) -> str:
        return repr(self._wrapper if self._wrapper is not None else self._obj)


_RAW_EXPOSED = ("layout", "get", "set", "get_raw", "set_raw", "getfield", "setfield",
                "field", "__len__", "__getitem__", "__setitem__", "item", "packed_slice",
                "__repr__")
_PACKABLE = frozenset("bBhHiIlLqQfd?")  # ctypes' codes that memoryview.cast knows


class _RawProxy(BaseProxy):
    """A shared ctypes object used through its creator (another host): ``.value``,
    ``.raw``, fields, ``len``, items and slices, each one round trip."""

    _exposed_: tuple[str, ...] = _RAW_EXPOSED
    _method_to_typeid_ = {"item": RAW_TYPEID, "field": RAW_TYPEID}

    if TYPE_CHECKING:  # the standard BaseProxy's (typeshed says it returns None)
        def _callmethod(self, methodname: str, args: tuple = (),
                        kwds: dict | None = None) -> Any: ...

    def _layout(self) -> tuple:
        layout = self.__dict__.get("_fiber_layout")
        if layout is None:
            layout = self._fiber_layout = self._callmethod("layout")
        return layout

    def __reduce__(self) -> Any:
        again = self.__dict__.get("_fiber_reduce")
        return again if again is not None else super().__reduce__()

    def __repr__(self) -> str:
        return self._callmethod("__repr__")

    @property
    def value(self) -> Any:
        return self._callmethod("get")

    @value.setter
    def value(self, value: Any) -> None:
        self._callmethod("set", (value,))

    @property
    def raw(self) -> Any:
        return self._callmethod("get_raw")

    @raw.setter
    def raw(self, value: Any) -> None:
        self._callmethod("set_raw", (value,))

    def __len__(self) -> int:
        layout = self._layout()
        if layout[0] != "array":
            raise TypeError(f"object of type {self._callmethod('__repr__')} has no len()")
        return int(layout[1])

    def __getitem__(self, index: int | slice) -> Any:
        layout = self._layout()
        if layout[0] == "array" and layout[2] and not layout[3] and isinstance(index, slice):
            got = self._callmethod("packed_slice", (index,))
            if isinstance(got, tuple):
                code, data = got
                return memoryview(data).cast(code).tolist()
            return got
        if layout[0] != "array" or layout[2]:
            return self._callmethod("__getitem__", (index,))
        if isinstance(index, slice):
            return [self._callmethod("item", (i,)) for i in range(*index.indices(layout[1]))]
        return self._callmethod("item", (index,))

    def __setitem__(self, index: int | slice, value: Any) -> None:
        self._callmethod("__setitem__", (index, value))

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or "_token" not in self.__dict__:
            raise AttributeError(name)
        fields = self._layout()
        if fields[0] == "struct" and name in fields[1]:
            return self._callmethod("getfield" if fields[1][name] else "field", (name,))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_") and name not in ("value", "raw"):
            fields = self._layout()
            if fields[0] == "struct" and name in fields[1]:
                self._callmethod("setfield", (name, value))
                return
        object.__setattr__(self, name, value)


class _SynchronizedProxy(_RawProxy):
    """A synchronized object used through its creator: each operation runs there
    under the object's lock; ``get_lock()`` is a proxy of that lock, ``get_obj()`` a
    :class:`_RawProxy` of the object."""

    _exposed_ = (*_RAW_EXPOSED, "get_obj", "get_lock")
    _method_to_typeid_ = {"item": RAW_TYPEID, "field": RAW_TYPEID, "get_obj": RAW_TYPEID,
                          "get_lock": LOCK_TYPEID}

    def get_obj(self) -> Any:
        return self._callmethod("get_obj")

    def get_lock(self) -> Any:
        lock = self.__dict__.get("_fiber_lock")
        if lock is None:
            lock = self._fiber_lock = self._callmethod("get_lock")
        return lock

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return self.get_lock().acquire(*args, **kwargs)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self) -> Any:
        return self.get_lock().__enter__()

    def __exit__(self, *args: Any) -> Any:
        return self.get_lock().__exit__(*args)
