"""fiber: the multiprocessing API for a whole computer cluster.

``import fiber as multiprocessing`` and the same Process, Queue, Pipe, Pool and
Manager code runs on the local machine or as jobs on a cluster backend, selected by
``FIBER_BACKEND`` (or ``.fiberconfig``, or ``fiber.init(backend=...)``).

Importing fiber is cheap: each name below is imported from its module on first use
(``fiber.Pool`` imports :mod:`fiber.pool`, and so the runtime and the wire), so a
program pays only for what it uses, and no backend plugin is loaded before a setting
or a backend is needed.
"""

from __future__ import annotations

import importlib

from fiber._version import __version__

# as typing.TYPE_CHECKING (type checkers take it so), for start-up time: importing
# typing would be most of the time of a bare `import fiber`
TYPE_CHECKING = False

# name -> the module that defines it (the API modules mirror multiprocessing's)
_WHERE = {
    "Process": "fiber.process", "current_process": "fiber.process",
    "parent_process": "fiber.process", "active_children": "fiber.process",
    "Pool": "fiber.pool",
    "Queue": "fiber.queues", "JoinableQueue": "fiber.queues", "SimpleQueue": "fiber.queues",
    "Pipe": "fiber.connection",
    "Manager": "fiber.managers",
    "Lock": "fiber.synchronize", "RLock": "fiber.synchronize",
    "Semaphore": "fiber.synchronize", "BoundedSemaphore": "fiber.synchronize",
    "Condition": "fiber.synchronize", "Event": "fiber.synchronize",
    "Barrier": "fiber.synchronize",
    "Value": "fiber.sharedctypes", "Array": "fiber.sharedctypes",
    "RawValue": "fiber.sharedctypes", "RawArray": "fiber.sharedctypes",
    "Ring": "fiber.ring",
    "meta": "fiber.meta", "Resources": "fiber.backend.resources",
    "init": "fiber.runtime.config", "reset": "fiber.runtime.config",
    "get_logger": "fiber.util", "log_to_stderr": "fiber.util",
    "cpu_count": "fiber.context", "get_context": "fiber.context",
    "set_start_method": "fiber.context", "get_start_method": "fiber.context",
    "get_all_start_methods": "fiber.context", "freeze_support": "fiber.context",
    "set_executable": "fiber.context", "set_forkserver_preload": "fiber.context",
    "allow_connection_pickling": "fiber.context", "get_config_value": "fiber.context",
    "reducer": "fiber.context",
    "ProcessError": "fiber.errors", "BufferTooShort": "fiber.errors",
    "TimeoutError": "fiber.errors", "AuthenticationError": "fiber.errors",
    "ProcessStartError": "fiber.errors", "ConnectionLostError": "fiber.errors",
    "RemoteError": "fiber.errors", "WorkerLostError": "fiber.errors",
    "FiberThreadError": "fiber.errors",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name == "config":  # uber/fiber 0.2's settings module (deprecated): fiber.config
        return importlib.import_module("fiber.config")
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'fiber' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and IDEs see
    from typing import Any

    from fiber.backend.resources import Resources
    from fiber.connection import Pipe
    from fiber.context import (
        allow_connection_pickling,
        cpu_count,
        freeze_support,
        get_all_start_methods,
        get_config_value,
        get_context,
        get_start_method,
        set_executable,
        set_forkserver_preload,
        set_start_method,
    )
    from fiber.errors import (
        AuthenticationError,
        BufferTooShort,
        ConnectionLostError,
        FiberThreadError,
        ProcessError,
        ProcessStartError,
        RemoteError,
        TimeoutError,
        WorkerLostError,
    )
    from fiber.managers import Manager
    from fiber.meta import meta
    from fiber.pool import Pool
    from fiber.process import Process, active_children, current_process, parent_process
    from fiber.queues import JoinableQueue, Queue, SimpleQueue
    from fiber.ring import Ring
    from fiber.runtime.config import init, reset
    from fiber.sharedctypes import Array, RawArray, RawValue, Value
    from fiber.synchronize import (
        Barrier,
        BoundedSemaphore,
        Condition,
        Event,
        Lock,
        RLock,
        Semaphore,
    )
    from fiber.util import get_logger, log_to_stderr
