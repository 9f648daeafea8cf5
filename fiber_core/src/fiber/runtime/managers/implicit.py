"""The manager this process starts for primitives made without one.

:mod:`fiber.synchronize` and :mod:`fiber.sharedctypes` make their primitives as
objects of one SyncManager per process, started on first use (a child process,
listed by ``active_children()``) and started again if it has stopped. This module
holds it; the API modules say how to start one (:func:`get`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

from fiber.runtime.managers import stdlib

__all__ = ["get", "current", "shutdown"]

M = TypeVar("M", bound=stdlib.BaseManager)

_manager: Any = None
_lock = threading.Lock()


def _running(manager: Any) -> bool:
    return manager._state.value == stdlib.State.STARTED and manager._process.is_alive()


def get(start: Callable[[], M]) -> M:
    """This process's implicit manager: the one started before if it still runs, else
    a new one from ``start()`` (which returns a started manager)."""
    global _manager
    with _lock:
        if _manager is None or not _running(_manager):
            _manager = start()
        return cast(M, _manager)


def current() -> stdlib.BaseManager | None:
    """The implicit manager started last, if any (running or not)."""
    return _manager


def shutdown() -> None:
    """Stop the implicit manager, if one runs (the next :func:`get` starts a new one,
    and proxies of the old one stop working)."""
    global _manager
    with _lock:
        manager, _manager = _manager, None
    if manager is not None and manager._state.value == stdlib.State.STARTED:
        manager.shutdown()
