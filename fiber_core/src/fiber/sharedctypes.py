"""ctypes objects usable by every process of a run, as
:mod:`multiprocessing.sharedctypes`: :func:`Value` and :func:`Array`.

Today the value or array lives in a :class:`~fiber.managers.SyncManager` this process
starts on first use (the same one as :mod:`fiber.synchronize`'s primitives), with its
own lock (``get_lock()``, or the object itself in a ``with``): every access is a
network round trip to that manager, not a shared-memory access. Hence ``lock`` takes
only True or False (the object is synchronized either way), and a typecode must be one
of :mod:`array`'s or the type a simple ctypes type.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fiber.managers import Manager, SyncManager
from fiber.runtime.managers import implicit, stdlib
from fiber.runtime.managers.sync import SynchronizedArrayProxy, SynchronizedValueProxy

__all__ = ["Value", "Array"]


def _maker() -> SyncManager:
    """What makes the objects: this process's implicit manager."""
    return implicit.get(Manager)


def _check_lock(lock: object) -> None:
    if not isinstance(lock, bool):
        raise ValueError(f"lock={lock!r}: fiber's Value and Array take lock=True or False "
                         "(the value lives in a manager and always has its own lock, "
                         "get_lock())")


def _check_type(typecode_or_type: object) -> None:
    if isinstance(typecode_or_type, str):
        if typecode_or_type not in stdlib.typecode_to_type:
            raise ValueError(f"unknown typecode {typecode_or_type!r}: use one of "
                             f"{''.join(sorted(stdlib.typecode_to_type))} or a ctypes type")
    elif not stdlib.is_simple_ctype(typecode_or_type):
        raise TypeError(f"{typecode_or_type!r} is neither a typecode nor a ctypes type")


def Value(typecode_or_type: str | type, *args: Any,
          lock: bool = True) -> SynchronizedValueProxy:
    """A ctypes value usable by every process of the run: ``.value``, ``get_lock()``."""
    _check_lock(lock)
    _check_type(typecode_or_type)
    return _maker().SynchronizedValue(typecode_or_type, *args)


def Array(typecode_or_type: str | type, size_or_initializer: int | Iterable[Any], *,
          lock: bool = True) -> SynchronizedArrayProxy:
    """A ctypes array usable by every process of the run."""
    _check_lock(lock)
    _check_type(typecode_or_type)
    return _maker().SynchronizedArray(typecode_or_type, size_or_initializer)
