"""multiprocessing's module-level functions for fiber: ``get_context``,
``set_start_method`` and friends, and the context objects they return, named as in
:mod:`multiprocessing.context` (``BaseContext``, ``DefaultContext``, ``SpawnContext``,
``ForkContext``, ``ForkServerContext`` and their ``*Process`` classes).

The start methods are multiprocessing's (``spawn``, ``fork``, ``forkserver``; the
default is ``spawn``) and behave as documented there: ``get_context(m)`` is the context
of method ``m`` and ``get_context(m).get_start_method() == m``; ``set_start_method``
sets the default context once (again only with ``force=True``). What a method changes
for fiber's processes: nothing. Every process is a job on the selected backend and
starts as multiprocessing's *spawn* does (the job imports the parent's main module as
``__mp_main__`` and receives the pickled Process object; nothing is inherited), whatever
the method; the local backend's own way of starting jobs is its ``local_start_method``
setting. The method is recorded (``Process._start_method``), so code that asks gets the
name it chose. A context's other attributes are the ``fiber`` module's API.

``assert_spawning``, ``get_spawning_popen`` and ``set_spawning_popen`` are
multiprocessing's own: while a fiber job's payload (the pickled Process and its
arguments) is made, the job's Popen is the spawning popen
(:mod:`fiber.runtime.popen_payload`), so ``assert_spawning(obj)`` passes there, as in a
spawned child's pickle, and raises RuntimeError anywhere else (an object sent through a
Queue, a Pipe or a Pool task: fiber then raises ``SerializationError`` for it).
"""

from __future__ import annotations

import os
import sys
from multiprocessing.context import assert_spawning, get_spawning_popen, set_spawning_popen
from typing import Any

from fiber.errors import AuthenticationError, BufferTooShort, ProcessError, TimeoutError
from fiber.runtime import config

# the default first, as multiprocessing.get_all_start_methods() lists them
START_METHODS = ("spawn", "fork", "forkserver")
DEFAULT_START_METHOD = "spawn"

__all__ = [
    "BaseContext", "DefaultContext", "SpawnContext", "ForkContext", "ForkServerContext",
    "ProcessError", "BufferTooShort", "TimeoutError", "AuthenticationError",
    "START_METHODS", "DEFAULT_START_METHOD", "cpu_count", "get_context",
    "set_start_method", "get_start_method", "get_all_start_methods", "freeze_support",
    "set_executable", "set_forkserver_preload", "allow_connection_pickling",
    "get_config_value", "assert_spawning", "get_spawning_popen", "set_spawning_popen",
]  # and, made on first use (see __getattr__): Process, SpawnProcess, ForkProcess,
#    ForkServerProcess


def get_config_value(name: str) -> Any:
    """fiber extension: the effective value of a setting (``fiber config`` shows all)."""
    return getattr(config.get_config(), name)


def cpu_count() -> int:
    """The number of CPUs of this machine (as multiprocessing.cpu_count())."""
    count = os.cpu_count()
    if count is None:
        raise NotImplementedError("cannot determine number of cpus")
    return count


def freeze_support() -> None:
    """Accepted for compatibility (does nothing: jobs never run a frozen executable)."""


def set_executable(executable: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> None:
    """Set the Python executable of jobs (the ``python`` setting). As in
    multiprocessing, a str, bytes or path object."""
    config.init(python=os.fsdecode(executable))


def set_forkserver_preload(module_names: list[str]) -> None:
    """Accepted for compatibility (does nothing: the local backend's template already
    imports the modules the parent has imported)."""


def allow_connection_pickling() -> None:
    """Accepted for compatibility: fiber connections are always picklable."""


class BaseContext:
    """The API of a context: multiprocessing's functions, and, as attributes, the
    ``fiber`` module's API (``ctx.Queue()``, ``ctx.Pool()``, ...)."""

    _name: str | None = None

    ProcessError = ProcessError
    BufferTooShort = BufferTooShort
    TimeoutError = TimeoutError
    AuthenticationError = AuthenticationError

    cpu_count = staticmethod(cpu_count)
    freeze_support = staticmethod(freeze_support)
    set_executable = staticmethod(set_executable)
    set_forkserver_preload = staticmethod(set_forkserver_preload)
    allow_connection_pickling = staticmethod(allow_connection_pickling)
    get_config_value = staticmethod(get_config_value)

    def __getattr__(self, name: str) -> Any:
        module = sys.modules["fiber"]
        if name in module.__all__:
            return getattr(module, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        """The Process class of this context's start method."""
        return _process_class(self._name)

    @property
    def reducer(self) -> Any:
        """The reduction module (:mod:`fiber.reduction`), as ``ctx.reducer``."""
        import fiber.reduction  # lazy: only code that asks for it pays for it

        return fiber.reduction

    def get_context(self, method: str | None = None) -> BaseContext:
        """The context of ``method`` (this one when None)."""
        if method is None:
            return self
        try:
            return _concrete_contexts[method]
        except KeyError:
            raise ValueError(f"cannot find context for {method!r}") from None

    def get_start_method(self, allow_none: bool = False) -> str | None:
        return self._name

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        raise ValueError("cannot set start method of concrete context")

    def get_all_start_methods(self) -> list[str]:
        return list(START_METHODS)

    def get_logger(self) -> Any:
        from fiber import util

        return util.get_logger()

    def log_to_stderr(self, level: int | str | None = None) -> Any:
        from fiber import util

        return util.log_to_stderr(level)

    def __repr__(self) -> str:
        return f"<fiber context {self._name!r}>"


class SpawnContext(BaseContext):
    _name = "spawn"


class ForkContext(BaseContext):
    _name = "fork"


class ForkServerContext(BaseContext):
    _name = "forkserver"


_concrete_contexts: dict[str, BaseContext] = {
    "spawn": SpawnContext(), "fork": ForkContext(), "forkserver": ForkServerContext(),
}


class DefaultContext(BaseContext):
    """The context of the module-level functions: its start method is the one
    :func:`set_start_method` chose, else ``spawn``."""

    def __init__(self, default: BaseContext) -> None:
        self._default_context = default
        self._actual_context: BaseContext | None = None

    @property
    def _name(self) -> str | None:  # type: ignore[override]  # follows the actual context
        return self.get_start_method(allow_none=True)

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        return _process_class(None)

    def get_context(self, method: str | None = None) -> BaseContext:
        if method is None:
            if self._actual_context is None:
                self._actual_context = self._default_context
            return self._actual_context
        return super().get_context(method)

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        if self._actual_context is not None and not force:
            raise RuntimeError("context has already been set")
        if method is None and force:
            self._actual_context = None
            return
        self._actual_context = self.get_context(method)

    def get_start_method(self, allow_none: bool = False) -> str | None:
        if self._actual_context is None:
            if allow_none:
                return None
            self._actual_context = self._default_context
        return self._actual_context._name

    def __repr__(self) -> str:
        return f"<fiber default context {self.get_start_method(allow_none=True)!r}>"


_default_context = DefaultContext(_concrete_contexts[DEFAULT_START_METHOD])

get_context = _default_context.get_context
set_start_method = _default_context.set_start_method
get_start_method = _default_context.get_start_method
get_all_start_methods = _default_context.get_all_start_methods

_PROCESS_CLASSES = {"spawn": "SpawnProcess", "fork": "ForkProcess",
                    "forkserver": "ForkServerProcess"}


def _process_class(method: str | None) -> type:
    """``fiber.Process``, or its subclass that records ``method`` (made on first use:
    defining it imports :mod:`fiber.process`, and so the runtime)."""
    from fiber.process import Process

    if method is None:
        return Process
    name = _PROCESS_CLASSES[method]
    cls = globals().get(name)
    if cls is None:
        cls = type(name, (Process,), {
            "_start_method": method, "__module__": __name__,
            "__doc__": f"A fiber Process of a {method!r} context (started as every fiber "
                       "process is: a job on the selected backend)."})
        globals()[name] = cls
    return cls


def __getattr__(name: str) -> Any:
    """``Process`` and the ``*Process`` classes, made on first use (see above), and
    ``reducer`` (``multiprocessing.reducer``: the reduction module)."""
    if name == "reducer":
        return _default_context.reducer
    if name == "Process":
        return _process_class(None)
    for method, class_name in _PROCESS_CLASSES.items():
        if name == class_name:
            return _process_class(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
