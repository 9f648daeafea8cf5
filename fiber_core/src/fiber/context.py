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
name it chose. ``set_start_method`` takes a start method only (a backend name raises
ValueError: the default context's jobs follow the ``backend`` setting, see
``fiber.init``).

As in multiprocessing, a context's factories (``ctx.Queue()``, ``ctx.Pool()``,
``ctx.Lock()``...) pass the context (``ctx=``, ``context=`` for ``Pool``) to what they
make, and the ``fiber`` module's functions are the default context's methods. A
context carries the run target its objects are served for and its jobs start on
(:meth:`BaseContext.run_target`, a :class:`fiber.runtime.run.Target`); an object asks
its context for it (:func:`fiber.runtime.run.of`), an object made without a context
gets the default context's. ``ctx.Process`` is a Process class of the context (a
subclass of ``fiber.Process`` whose ``_ctx`` is the context); ``fiber.Process`` and
its subclasses that name no context start on the default context's target.

fiber extension, a backend per context: ``get_context(name, **overrides)`` with the
name of an installed backend (``fiber backends`` lists them) returns a
:class:`BackendContext` whose ``Process``, ``Pool``, ``Queue``, ``Pipe``, ``Manager``,
locks and shared values make jobs on that backend, with ``overrides`` on top of the
settings (``get_context("kubernetes", image="me/img:1", kubernetes_namespace="rl")``;
validated as ``fiber.init``'s, an error names the setting). Its jobs get those
settings as theirs. The objects it makes are served on this process's hub for that
backend (bound to the backend's ``listen_address()``, or the ``listen_address``
setting or override), so its jobs reach them; an object made in one context can be
handed to a job of another backend when that job's network reaches the address it was
served at (a loopback address, the local and host-network docker backends', only from
the same machine): a job that cannot reach it gets ``ConnectionError`` from its first
use, after the connect timeout, saying so. Method names with overrides give a
context of the default backend with them. One backend instance exists per name and
overrides (:func:`fiber.runtime.run.target`). A backend context pickles as its name,
start method and overrides (a job that receives a process of it gets none of the
parent's state: its backend instance, hub and settings are made there if used).

``assert_spawning``, ``get_spawning_popen`` and ``set_spawning_popen`` are
multiprocessing's own: while a fiber job's payload (the pickled Process and its
arguments) is made, the job's Popen is the spawning popen
(:mod:`fiber.runtime.popen_payload`), so ``assert_spawning(obj)`` passes there, as in a
spawned child's pickle, and raises RuntimeError anywhere else (an object sent through a
Queue, a Pipe or a Pool task: fiber then raises ``SerializationError`` for it).
"""

from __future__ import annotations

import os
from multiprocessing.context import assert_spawning, get_spawning_popen, set_spawning_popen
from typing import TYPE_CHECKING, Any

from fiber.errors import AuthenticationError, BufferTooShort, ProcessError, TimeoutError
from fiber.runtime import config

if TYPE_CHECKING:  # imported where used (start-up time: the runtime, the wire)
    from fiber.runtime.run import Target

# the default first, as multiprocessing.get_all_start_methods() lists them
START_METHODS = ("spawn", "fork", "forkserver")
DEFAULT_START_METHOD = "spawn"

__all__ = [
    "BaseContext", "DefaultContext", "SpawnContext", "ForkContext", "ForkServerContext",
    "BackendContext",
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
    """The API of a context: multiprocessing's functions and factories (each passes
    the context to what it makes), and fiber's ``Ring`` and ``run_target``."""

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

    def run_target(self) -> Target:
        """fiber extension: the target this context's objects are served for and its
        jobs start on. A start method's context: the default target (the ``backend``
        setting's backend, with the process's settings)."""
        from fiber.runtime import run  # lazy: the runtime costs start-up time

        return run.target()

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        """The Process class of this context's start method."""
        return _process_class(self._name)

    def current_process(self) -> Any:
        from fiber.process import current_process

        return current_process()

    def parent_process(self) -> Any:
        from fiber.process import parent_process

        return parent_process()

    def active_children(self) -> list[Any]:
        from fiber.process import active_children

        return active_children()

    def Manager(self) -> Any:  # noqa: N802 - multiprocessing's name
        """A started SyncManager whose server is a job of this context."""
        from fiber.managers import Manager

        return Manager(ctx=self.get_context())

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:  # noqa: N802
        """Two connected ends, served for this context's jobs."""
        from fiber.connection import Pipe

        return Pipe(duplex, ctx=self.get_context())

    def Lock(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Lock

        return Lock(ctx=self.get_context())

    def RLock(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import RLock

        return RLock(ctx=self.get_context())

    def Condition(self, lock: Any = None) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Condition

        return Condition(lock, ctx=self.get_context())

    def Semaphore(self, value: int = 1) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Semaphore

        return Semaphore(value, ctx=self.get_context())

    def BoundedSemaphore(self, value: int = 1) -> Any:  # noqa: N802
        from fiber.synchronize import BoundedSemaphore

        return BoundedSemaphore(value, ctx=self.get_context())

    def Event(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Event

        return Event(ctx=self.get_context())

    def Barrier(self, parties: int, action: Any = None,  # noqa: N802
                timeout: float | None = None) -> Any:
        from fiber.synchronize import Barrier

        return Barrier(parties, action, timeout, ctx=self.get_context())

    def Queue(self, maxsize: int = 0) -> Any:  # noqa: N802 - multiprocessing's name
        """A queue served for this context's jobs."""
        from fiber.queues import Queue

        return Queue(maxsize, ctx=self.get_context())

    def JoinableQueue(self, maxsize: int = 0) -> Any:  # noqa: N802
        """A joinable queue served for this context's jobs."""
        from fiber.queues import JoinableQueue

        return JoinableQueue(maxsize, ctx=self.get_context())

    def SimpleQueue(self) -> Any:  # noqa: N802 - multiprocessing's name
        """A simple queue served for this context's jobs."""
        from fiber.queues import SimpleQueue

        return SimpleQueue(ctx=self.get_context())

    def Pool(self, processes: int | None = None, initializer: Any = None,  # noqa: N802
             initargs: Any = (), maxtasksperchild: int | None = None,
             context: Any = None, **extensions: Any) -> Any:
        """A Pool whose workers are this context's processes (fiber extensions:
        ``context``, another context's instead, as :class:`fiber.pool.Pool` takes it;
        ``extensions``, its keyword-only arguments)."""
        from fiber.pool import Pool

        return Pool(processes, initializer, initargs, maxtasksperchild,
                    self.get_context() if context is None else context, **extensions)

    def RawValue(self, typecode_or_type: Any, *args: Any) -> Any:  # noqa: N802
        from fiber.sharedctypes import RawValue

        return RawValue(typecode_or_type, *args)

    def RawArray(self, typecode_or_type: Any, size_or_initializer: Any) -> Any:  # noqa: N802
        from fiber.sharedctypes import RawArray

        return RawArray(typecode_or_type, size_or_initializer)

    def Value(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> Any:  # noqa: N802
        from fiber.sharedctypes import Value

        return Value(typecode_or_type, *args, lock=lock, ctx=self.get_context())

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, *,  # noqa: N802
              lock: Any = True) -> Any:
        from fiber.sharedctypes import Array

        return Array(typecode_or_type, size_or_initializer, lock=lock,
                     ctx=self.get_context())

    def Ring(self, processes: int, func: Any, initializer: Any = None,  # noqa: N802
             initargs: Any = ()) -> Any:
        """fiber extension: a :class:`fiber.ring.Ring` whose members are this
        context's processes."""
        from fiber.ring import Ring

        return Ring(processes, func, initializer, initargs, ctx=self.get_context())

    @property
    def reducer(self) -> Any:
        """The reduction module (:mod:`fiber.reduction`), as ``ctx.reducer``."""
        import fiber.reduction  # lazy: only code that asks for it pays for it

        return fiber.reduction

    def get_context(self, method: str | None = None, **overrides: Any) -> BaseContext:
        """The context of ``method`` (this one when None): a start method's, or, fiber
        extension, the context of an installed backend's name, with setting
        ``overrides`` (see the module's docstring)."""
        if method is None and not overrides:
            return self
        if method in _concrete_contexts and not overrides:
            return _concrete_contexts[method]
        return _backend_context(method, overrides)

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
    :func:`set_start_method` chose, else ``spawn``; its target is the default one."""

    def __init__(self, default: BaseContext) -> None:
        self._default_context = default
        self._actual_context: BaseContext | None = None

    @property
    def _name(self) -> str | None:  # type: ignore[override]  # follows the actual context
        return self.get_start_method(allow_none=True)

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        return _process_class(None)

    def get_context(self, method: str | None = None, **overrides: Any) -> BaseContext:
        if method is None and not overrides:
            if self._actual_context is None:
                self._actual_context = self._default_context
            return self._actual_context
        return super().get_context(method, **overrides)

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        if self._actual_context is not None and not force:
            raise RuntimeError("context has already been set")
        if method is None and force:
            self._actual_context = None
            return
        if method is not None and method not in _concrete_contexts:
            # a name that is neither a method nor a backend raises here, saying so
            super().get_context(method)
            # the default context's jobs follow the backend setting: a backend is
            # chosen by fiber.init(backend=...) or a context of its own
            error = ValueError(f"cannot find context for {method!r}")
            if hasattr(error, "add_note"):
                error.add_note(f"set_start_method takes a start method "
                               f"({', '.join(START_METHODS)}); for the jobs of a backend, "
                               f"use fiber.init(backend={method!r}) or "
                               f"fiber.get_context({method!r})")
            raise error
        self._actual_context = self.get_context(method)

    def get_start_method(self, allow_none: bool = False) -> str | None:
        if self._actual_context is None:
            if allow_none:
                return None
            self._actual_context = self._default_context
        return self._actual_context._name

    def __repr__(self) -> str:
        return f"<fiber default context {self.get_start_method(allow_none=True)!r}>"


class BackendContext(BaseContext):
    """fiber extension: the context of a backend, with setting overrides
    (``fiber.get_context("slurm", slurm_partition="debug")``). Its start method is
    ``method`` (``spawn`` unless made from a method name with overrides)."""

    def __init__(self, backend: str | None, overrides: dict[str, Any],
                 method: str = DEFAULT_START_METHOD) -> None:
        self._name = method
        self._backend_name = backend
        self._overrides = dict(overrides)
        self._target: Target | None = None  # made on first use (run_target)
        self._process_class: type | None = None

    def run_target(self) -> Target:
        """The target of this context's backend and overrides (validated when made:
        :func:`get_context` makes it, so a bad override raises there)."""
        if self._target is None:
            from fiber.runtime import run  # lazy: the runtime costs start-up time

            self._target = run.target(self._backend_name, self._overrides)
        return self._target

    @property
    def backend(self) -> str:
        """The name of the backend this context's jobs run on."""
        return str(self.run_target().config().backend)

    @property
    def overrides(self) -> dict[str, Any]:
        """The settings this context gives on top of the process's."""
        return dict(self._overrides)

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        """The Process class whose jobs run on this context's backend."""
        if self._process_class is None:
            base = _process_class(self._name)
            self._process_class = type(base.__name__, (base,), {
                "_ctx": self, "__module__": __name__,
                "__doc__": f"A fiber Process of the context {self!r}."})
        return self._process_class

    def __reduce__(self) -> tuple[Any, ...]:
        # its name, method and overrides: never the parent's target (a job that gets
        # a Process class of this context makes its own, should it start one)
        return _restored_context, (self._backend_name, self._overrides, self._name)

    def __repr__(self) -> str:
        settings = "".join(f", {k}={v!r}" for k, v in sorted(self._overrides.items()))
        return f"<fiber context {self._backend_name or self._name!r}{settings}>"


_backend_contexts: dict[tuple[str | None, str, str], BackendContext] = {}


def _key(backend: str | None, method: str,
         overrides: dict[str, Any]) -> tuple[str | None, str, str]:
    return backend, method, repr(sorted(overrides.items()))


def _backend_context(name: str | None, overrides: dict[str, Any]) -> BackendContext:
    """The context of backend ``name`` (or of a method name: the default backend)
    with ``overrides``: one per name and overrides."""
    from fiber.backend import registry

    method = DEFAULT_START_METHOD
    backend: str | None = name
    if name in START_METHODS:
        method, backend = name, None
    elif name is not None and name not in registry.backends():
        installed = ", ".join(sorted([*START_METHODS, *registry.backends()]))
        hint = registry.install_hint(name) if isinstance(name, str) else ""
        # multiprocessing's message, with fiber's advice as a note (Python >= 3.11)
        error = ValueError(f"cannot find context for {name!r}")
        if hasattr(error, "add_note"):
            error.add_note(f"{name!r} is neither a start method nor an installed backend "
                           f"(known: {installed}); {hint}")
        raise error
    key = _key(backend, method, overrides)
    context = _backend_contexts.get(key)
    if context is None:
        made = BackendContext(backend, overrides, method)
        made.run_target()  # validates the overrides before the context is kept
        context = _backend_contexts.setdefault(key, made)
    return context


def _restored_context(backend: str | None, overrides: dict[str, Any],
                      method: str) -> BackendContext:
    """A backend context unpickled (in a job): the one of this process for that
    backend, method and overrides, made unchecked (its target is made, and checked,
    only if this process uses it)."""
    key = _key(backend, method, overrides)
    return _backend_contexts.get(key) or _backend_contexts.setdefault(
        key, BackendContext(backend, overrides, method))


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
            "_start_method": method, "_ctx": _concrete_contexts[method],
            "__module__": __name__,
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
