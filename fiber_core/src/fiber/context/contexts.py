"""The context classes, named as in :mod:`multiprocessing.context`: ``BaseContext``,
the start methods' ``SpawnContext``, ``ForkContext``, ``ForkServerContext``, the
``DefaultContext`` of the module-level functions, fiber's ``BackendContext`` (a
backend with setting overrides), the ``*Process`` classes of each, and which context a
name selects (:meth:`BaseContext.get_context`: one context per backend, method and
overrides). :mod:`fiber.context` documents their behaviour and is where they are
imported from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fiber.context import functions
from fiber.context.factories import Factories
from fiber.errors import AuthenticationError, BufferTooShort, ProcessError, TimeoutError

if TYPE_CHECKING:  # imported where used (start-up time: the runtime, the wire)
    from fiber.runtime.run import Target

# the default first, as multiprocessing.get_all_start_methods() lists them
START_METHODS = ("spawn", "fork", "forkserver")
DEFAULT_START_METHOD = "spawn"
#: the module the *Process classes are public in (and pickled by)
PUBLIC_MODULE = "fiber.context"

__all__ = ["BaseContext", "DefaultContext", "SpawnContext", "ForkContext",
           "ForkServerContext", "BackendContext", "START_METHODS", "DEFAULT_START_METHOD",
           "PROCESS_CLASSES", "process_class", "concrete_context"]


class BaseContext(Factories):
    """The API of a context: multiprocessing's functions and factories (each passes
    the context to what it makes), and fiber's ``Ring`` and ``run_target``."""

    _name: str | None = None

    ProcessError = ProcessError
    BufferTooShort = BufferTooShort
    TimeoutError = TimeoutError
    AuthenticationError = AuthenticationError

    cpu_count = staticmethod(functions.cpu_count)
    freeze_support = staticmethod(functions.freeze_support)
    set_executable = staticmethod(functions.set_executable)
    set_forkserver_preload = staticmethod(functions.set_forkserver_preload)
    allow_connection_pickling = staticmethod(functions.allow_connection_pickling)
    get_config_value = staticmethod(functions.get_config_value)

    def run_target(self) -> Target:
        """fiber extension: the target this context's objects are served for and its
        jobs start on. A start method's context: the default target (the ``backend``
        setting's backend, with the process's settings)."""
        from fiber.runtime import run  # lazy: the runtime costs start-up time

        return run.target()

    @property
    def Process(self) -> type:  # noqa: N802 - multiprocessing's name
        """The Process class of this context's start method."""
        return process_class(self._name)

    def get_context(self, method: str | None = None, **overrides: Any) -> BaseContext:
        """The context of ``method`` (this one when None): a start method's, or, fiber
        extension, the context of an installed backend's name, with setting
        ``overrides`` (see :mod:`fiber.context`)."""
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
        return process_class(None)

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
            base = process_class(self._name)
            self._process_class = type(base.__name__, (base,), {
                "_ctx": self, "__module__": PUBLIC_MODULE,
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
    elif isinstance(name, str) and (fault := registry.backend_fault(name)) is not None:
        # multiprocessing's message, with why the backend cannot be used
        raise ValueError(f"cannot find context for {name!r}: {fault}")
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


def concrete_context(method: str) -> BaseContext:
    """The context of start method ``method`` (one each, as in multiprocessing)."""
    return _concrete_contexts[method]


PROCESS_CLASSES = {"spawn": "SpawnProcess", "fork": "ForkProcess",
                   "forkserver": "ForkServerProcess"}
_process_classes: dict[str, type] = {}


def process_class(method: str | None) -> type:
    """``fiber.Process``, or its subclass that records ``method`` (made on first use:
    defining it imports :mod:`fiber.process`, and so the runtime), public as
    ``fiber.context.SpawnProcess``... (:data:`PROCESS_CLASSES`)."""
    from fiber.process import Process

    if method is None:
        return Process
    cls = _process_classes.get(method)
    if cls is None:
        cls = type(PROCESS_CLASSES[method], (Process,), {
            "_start_method": method, "_ctx": _concrete_contexts[method],
            "__module__": PUBLIC_MODULE,
            "__doc__": f"A fiber Process of a {method!r} context (started as every fiber "
                       "process is: a job on the selected backend)."})
        cls = _process_classes.setdefault(method, cls)
    return cls
