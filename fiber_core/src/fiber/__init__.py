"""fiber: the multiprocessing API for a whole computer cluster.

``import fiber as multiprocessing`` and the same Process, Queue, Pipe, Pool and
Manager code runs on the local machine or as jobs on a cluster backend, selected by
``FIBER_BACKEND`` (or ``.fiberconfig``, or ``fiber.init(backend=...)``).

As in multiprocessing, the module's functions are the default context's methods
(:mod:`fiber.context`: ``fiber.Queue()`` is ``get_context().Queue()``, and passes the
context to the queue it makes); ``fiber.Process`` is the Process class of the
default context. Importing fiber is cheap: each name below is imported on first use
(``fiber.Pool()`` imports :mod:`fiber.pool`, and so the runtime and the wire), so a
program pays only for what it uses, and no backend plugin is loaded before a setting
or a backend is needed.
"""

from __future__ import annotations

import importlib as _importlib

from fiber._version import __version__

# as typing.TYPE_CHECKING (type checkers take it so), for start-up time: importing
# typing would be most of the time of a bare `import fiber`; deleted at the end of the
# module, with the future import's name, so that every public-looking name of the
# module is in __all__ or is a submodule, as multiprocessing's (issue #43)
TYPE_CHECKING = False

# the names that are the default context's (fiber.context), as multiprocessing's are
# its default context's: fiber.Queue() is the default context's Queue(), which passes
# the context to the queue it makes; fiber.Process is its Process class
_OF_DEFAULT_CONTEXT = (
    "Process", "current_process", "parent_process", "active_children", "Pool",
    "Queue", "JoinableQueue", "SimpleQueue", "Pipe", "Manager", "Lock", "RLock",
    "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Value", "Array",
    "RawValue", "RawArray", "Ring", "get_logger", "log_to_stderr", "cpu_count",
    "get_context", "set_start_method", "get_start_method", "get_all_start_methods",
    "freeze_support", "set_executable", "set_forkserver_preload",
    "allow_connection_pickling", "get_config_value", "reducer",
)

# the other names -> the module that defines them
_WHERE = {
    "meta": "fiber.meta", "Resources": "fiber.backend.resources",
    "init": "fiber.runtime.config", "reset": "fiber.runtime.config",
    "ProcessError": "fiber.errors", "BufferTooShort": "fiber.errors",
    "TimeoutError": "fiber.errors", "AuthenticationError": "fiber.errors",
    "ProcessStartError": "fiber.errors", "ConnectionLostError": "fiber.errors",
    "RemoteError": "fiber.errors", "WorkerLostError": "fiber.errors",
    "FiberThreadError": "fiber.errors",
}

__all__ = [*_OF_DEFAULT_CONTEXT, *_WHERE]


def __getattr__(name: str) -> Any:
    if name == "config":  # uber/fiber 0.2's settings module (deprecated): fiber.config
        return _importlib.import_module("fiber.config")
    if name in _OF_DEFAULT_CONTEXT:
        context = _importlib.import_module("fiber.context")
        value = getattr(context._default_context, name)
    else:
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module 'fiber' has no attribute {name!r}")
        value = getattr(_importlib.import_module(where), name)
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

del TYPE_CHECKING, annotations
