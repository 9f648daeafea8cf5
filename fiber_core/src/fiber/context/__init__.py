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

The package's modules: :mod:`fiber.context.contexts` (the context classes, the
``*Process`` classes, which context a name selects), :mod:`fiber.context.factories`
(what a context makes) and :mod:`fiber.context.functions` (the functions that need no
context); every name is imported from here.
"""

from __future__ import annotations

from multiprocessing.context import assert_spawning, get_spawning_popen, set_spawning_popen
from typing import Any

from fiber.context.contexts import (
    DEFAULT_START_METHOD,
    PROCESS_CLASSES,
    START_METHODS,
    BackendContext,
    BaseContext,
    DefaultContext,
    ForkContext,
    ForkServerContext,
    SpawnContext,
    concrete_context,
    process_class,
)
from fiber.context.functions import (
    allow_connection_pickling,
    cpu_count,
    freeze_support,
    get_config_value,
    set_executable,
    set_forkserver_preload,
)
from fiber.errors import AuthenticationError, BufferTooShort, ProcessError, TimeoutError

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

_default_context = DefaultContext(concrete_context(DEFAULT_START_METHOD))

get_context = _default_context.get_context
set_start_method = _default_context.set_start_method
get_start_method = _default_context.get_start_method
get_all_start_methods = _default_context.get_all_start_methods


def __getattr__(name: str) -> Any:
    """``Process`` and the ``*Process`` classes, made on first use (see
    :func:`fiber.context.contexts.process_class`), and ``reducer``
    (``multiprocessing.reducer``: the reduction module)."""
    if name == "reducer":
        return _default_context.reducer
    if name == "Process":
        return process_class(None)
    for method, class_name in PROCESS_CLASSES.items():
        if name == class_name:
            return process_class(method)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
