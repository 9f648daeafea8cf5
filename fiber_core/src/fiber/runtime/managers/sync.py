"""The types fiber's SyncManager serves: the standard SyncManager's, plus the values
and arrays behind :func:`fiber.sharedctypes.Value` and :func:`~fiber.sharedctypes.Array`.

The standard registry is taken as it is, with two changes: proxies are fiber's (they
pickle with the run's authkey), and ``Pool`` starts its multiprocessing workers
through a forkserver (:func:`server_pool`). :func:`registrations` lists the whole
registry; :class:`fiber.managers.SyncManager` registers it.

fiber's version of each standard proxy class (``ListProxy``, ``AcquirerProxy``...) is
made when this module is imported and kept as its attribute under the standard name:
a proxy pickles its class by reference, so a process that unpickles one (a job that
imported nothing of fiber's managers) finds the class by importing this module.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fiber.runtime.managers import stdlib
from fiber.runtime.managers.proxies import AutoProxy, BaseProxy, FiberProxyMixin

__all__ = ["Registration", "registrations", "server_pool", "SharedValue", "SharedArray",
           "SynchronizedValueProxy", "SynchronizedArrayProxy", "LOCK_TYPEID"]

LOCK_TYPEID = "_SharedLock"  # the lock of a value or an array (get_lock())


class Registration(NamedTuple):
    """The arguments of one ``register()`` call."""

    typeid: str
    callable: Callable[..., Any] | None
    proxytype: Any
    exposed: Sequence[str] | None = None
    method_to_typeid: Mapping[str, str] | None = None
    create_method: bool = True


def server_pool(processes: int | None = None,
                initializer: Callable[..., object] | None = None,
                initargs: Iterable[Any] = (), maxtasksperchild: int | None = None) -> Any:
    """The manager's ``Pool``: multiprocessing workers on the manager's machine, started
    through a forkserver (forking the threaded server itself can hang)."""
    ctx = multiprocessing.get_context("forkserver")
    return ctx.Pool(processes, initializer, initargs, maxtasksperchild)


def _ctype(typecode_or_type: str | type) -> Any:
    """The ctypes type a typecode names (a type is taken as it is)."""
    table: dict[Any, type] = stdlib.typecode_to_type
    return table.get(typecode_or_type, typecode_or_type)


class SharedValue:
    """What :func:`fiber.sharedctypes.Value` serves: a ctypes value and the lock of
    ``get_lock()``."""

    def __init__(self, typecode_or_type: str | type, *args: Any) -> None:
        ctype = _ctype(typecode_or_type)
        self._obj = ctype(*args)
        self._lock = threading.RLock()

    def get(self) -> Any:
        return self._obj.value

    def set(self, value: Any) -> None:
        self._obj.value = value

    def get_lock(self) -> Any:
        return self._lock


class SharedArray(SharedValue):
    """What :func:`fiber.sharedctypes.Array` serves: a ctypes array and the lock of
    ``get_lock()``."""

    def __init__(self, typecode_or_type: str | type,
                 size_or_initializer: int | Iterable[Any]) -> None:
        ctype = _ctype(typecode_or_type)
        if isinstance(size_or_initializer, int):
            self._obj = (ctype * size_or_initializer)()
        else:
            items = list(size_or_initializer)
            self._obj = (ctype * len(items))(*items)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._obj)

    def __getitem__(self, index: int | slice) -> Any:
        return self._obj[index]

    def __setitem__(self, index: int | slice, value: Any) -> None:
        self._obj[index] = value

    def get_raw(self) -> bytes:
        return self._obj.raw


class _SynchronizedMixin:
    """A value or an array that is its own lock: ``acquire``, ``release``, ``with``."""

    _lock_proxy: Any = None

    if TYPE_CHECKING:  # the proxy's (the class this mixes into)
        def _callmethod(self, methodname: str, args: tuple = (),
                        kwds: dict | None = None) -> Any: ...

    def get_lock(self) -> Any:
        if self._lock_proxy is None:
            self._lock_proxy = self._callmethod("get_lock")
        return self._lock_proxy

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """As a multiprocessing ``Synchronized`` value's: ``block``, and a ``timeout``
        that only a blocking call uses."""
        if not block or timeout is None:
            return self.get_lock().acquire(block)
        return self.get_lock().acquire(True, timeout)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self) -> bool:
        return self.get_lock().__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.get_lock().__exit__(*exc)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_lock_proxy", None)
        return state


class SynchronizedValueProxy(_SynchronizedMixin, BaseProxy):
    """What :func:`fiber.sharedctypes.Value` returns: ``.value``, ``get_lock()``,
    ``with v:``."""

    _exposed_ = ("get", "set", "get_lock")
    _method_to_typeid_ = {"get_lock": LOCK_TYPEID}

    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> None:
        self._callmethod("set", (value,))

    value = property(get, set)


class SynchronizedArrayProxy(_SynchronizedMixin, BaseProxy):
    """What :func:`fiber.sharedctypes.Array` returns: indexing, slicing, ``len``,
    ``get_lock()``."""

    _exposed_ = ("__len__", "__getitem__", "__setitem__", "get", "set", "get_raw",
                 "get_lock")

    def __len__(self) -> int:
        return self._callmethod("__len__")

    def __getitem__(self, index: int | slice) -> Any:
        return self._callmethod("__getitem__", (index,))

    def __setitem__(self, index: int | slice, value: Any) -> None:
        self._callmethod("__setitem__", (index, value))

    def _get_value(self) -> Any:
        return self._callmethod("get")

    def _set_value(self, value: Any) -> None:
        self._callmethod("set", (value,))

    value = property(_get_value, _set_value)
    raw = property(lambda self: self._callmethod("get_raw"))


def _fiber_proxy_class(std: type) -> type:
    """fiber's version of a standard proxy class (same methods, fiber pickling), made
    once and kept as an attribute of this module under the standard class's name."""
    name = std.__name__
    module = sys.modules[__name__]
    cls = getattr(module, name, None)
    if isinstance(cls, type) and issubclass(cls, std):
        return cls
    if cls is not None:
        raise RuntimeError(f"{__name__}.{name} exists: cannot keep fiber's {name} there")
    cls = type(name, (FiberProxyMixin, std), {"__module__": __name__, "__qualname__": name})
    setattr(module, name, cls)
    return cls


def _registrations() -> tuple[Registration, ...]:
    result = []
    proxytypes: dict[str, Any] = {}
    for typeid, (func, exposed, method_to_typeid, proxytype) in \
            stdlib.sync_registry().items():
        if typeid == "Pool":
            func = server_pool
        if proxytype is stdlib.AutoProxy:
            proxytype = AutoProxy
        else:
            proxytype = _fiber_proxy_class(proxytype)
        proxytypes[typeid] = proxytype
        result.append(Registration(
            typeid, func, proxytype, exposed, method_to_typeid,
            create_method=func is not None and typeid not in ("AsyncResult", "Iterator")))
    # get_lock() returns the threading.RLock of a SharedValue: proxied as RLock() is
    result.append(Registration(LOCK_TYPEID, None, proxytypes["RLock"], create_method=False))
    result.append(Registration("SynchronizedValue", SharedValue, SynchronizedValueProxy,
                               method_to_typeid={"get_lock": LOCK_TYPEID}))
    result.append(Registration("SynchronizedArray", SharedArray, SynchronizedArrayProxy,
                               method_to_typeid={"get_lock": LOCK_TYPEID}))
    return tuple(result)


_REGISTRATIONS = _registrations()  # at import: see the module's docstring


def registrations() -> list[Registration]:
    """Every type fiber's SyncManager serves, in the order to register them."""
    return list(_REGISTRATIONS)
