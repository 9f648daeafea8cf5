"""The public API as module-level functions, mirroring multiprocessing's context
(``get_context``, ``set_start_method`` and friends are accepted so that
``import fiber as multiprocessing`` works; fiber has one start method, ``"fiber"``:
every process is a job on the selected backend)."""

from __future__ import annotations

import os
import sys
from typing import Any

from fiber.config import get_config, init
from fiber.connection import Pipe
from fiber.errors import (
    AuthenticationError,
    BufferTooShort,
    ConnectionLostError,
    ProcessError,
    ProcessStartError,
    RemoteError,
    TimeoutError,
    WorkerLostError,
)
from fiber.managers import (
    Array,
    Barrier,
    BoundedSemaphore,
    Condition,
    Event,
    Lock,
    Manager,
    RLock,
    Semaphore,
    Value,
)
from fiber.meta import meta
from fiber.pool import Pool as _Pool
from fiber.process import (
    Process,
    _check_not_importing_main,
    active_children,
    current_process,
    parent_process,
)
from fiber.queues import JoinableQueue, Queue, SimpleQueue
from fiber.ring import Ring

START_METHODS = ("fiber", "spawn", "forkserver", "fork")

__all__ = [
    "Process", "Pool", "Queue", "JoinableQueue", "SimpleQueue", "Pipe", "Manager", "Lock",
    "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Value",
    "Array", "Ring", "current_process", "parent_process", "active_children", "cpu_count",
    "get_context", "set_start_method", "get_start_method", "get_all_start_methods",
    "freeze_support", "set_executable", "set_forkserver_preload", "allow_connection_pickling",
    "get_logger", "log_to_stderr", "init", "meta", "get_config_value",
    "ProcessError", "BufferTooShort", "TimeoutError", "AuthenticationError",
    "ProcessStartError", "ConnectionLostError", "RemoteError", "WorkerLostError",
]


class Pool(_Pool):
    __doc__ = _Pool.__doc__

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # raise here, not in the threads that start the workers (see Process.start)
        _check_not_importing_main()
        super().__init__(*args, **kwargs)


def get_config_value(name: str) -> Any:
    """fiber extension: the effective value of a setting (``fiber config`` shows all)."""
    return getattr(get_config(), name)


def cpu_count() -> int:
    """The number of CPUs of this machine (as multiprocessing.cpu_count())."""
    count = os.cpu_count()
    if count is None:
        raise NotImplementedError("cannot determine number of cpus")
    return count


class FiberContext:
    """What :func:`get_context` returns: the fiber module's API as attributes."""

    def __init__(self, method: str) -> None:
        self._method = method

    def __getattr__(self, name: str) -> Any:
        module = sys.modules["fiber"]
        if name in module.__all__:
            return getattr(module, name)
        raise AttributeError(name)

    def get_start_method(self, allow_none: bool = False) -> str:
        return self._method

    def __repr__(self) -> str:
        return f"<fiber context {self._method!r}>"


def get_context(method: str | None = None) -> FiberContext:
    """A context object with the fiber API. Every start method name of
    multiprocessing is accepted and means the same: a job on the selected backend."""
    if method is not None and method not in START_METHODS:
        raise ValueError(f"cannot find context for {method!r}")
    return FiberContext(method or "fiber")


_start_method: list[str | None] = [None]


def set_start_method(method: str | None, force: bool = False) -> None:
    """Accepted for compatibility; every method means "a job on the backend"."""
    if method is not None and method not in START_METHODS:
        raise ValueError(f"cannot find context for {method!r}")
    if _start_method[0] is not None and not force:
        raise RuntimeError("context has already been set")
    _start_method[0] = method


def get_start_method(allow_none: bool = False) -> str | None:
    if _start_method[0] is None and not allow_none:
        _start_method[0] = "fiber"
    return _start_method[0]


def get_all_start_methods() -> list[str]:
    return list(START_METHODS)


def freeze_support() -> None:
    """Accepted for compatibility (does nothing)."""


def set_executable(executable: str) -> None:
    """Set the Python executable of jobs (the ``python`` setting)."""
    init(python=executable)


def set_forkserver_preload(module_names: list[str]) -> None:
    """Accepted for compatibility (does nothing)."""


def allow_connection_pickling() -> None:
    """Accepted for compatibility: fiber connections are always picklable."""


def get_logger():
    """The ``fiber`` logger (multiprocessing's is ``multiprocessing``)."""
    import logging

    return logging.getLogger("fiber")


def log_to_stderr(level: int | None = None):
    import logging

    logger = get_logger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
    logger.addHandler(handler)
    if level:
        logger.setLevel(level)
    return logger
