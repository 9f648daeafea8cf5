"""multiprocessing's module-level functions for fiber: ``get_context``,
``set_start_method`` and friends, and the context objects they return.

``import fiber as multiprocessing`` works because these accept every start method name
of multiprocessing; fiber has one way to start a process, ``"fiber"``: every process is
a job on the selected backend. A context's attributes are the ``fiber`` module's API.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fiber.runtime import config

START_METHODS = ("fiber", "spawn", "forkserver", "fork")

__all__ = [
    "FiberContext", "START_METHODS", "cpu_count", "get_context", "set_start_method",
    "get_start_method", "get_all_start_methods", "freeze_support", "set_executable",
    "set_forkserver_preload", "allow_connection_pickling", "get_config_value",
]


def get_config_value(name: str) -> Any:
    """fiber extension: the effective value of a setting (``fiber config`` shows all)."""
    return getattr(config.get_config(), name)


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
    config.init(python=executable)


def set_forkserver_preload(module_names: list[str]) -> None:
    """Accepted for compatibility (does nothing)."""


def allow_connection_pickling() -> None:
    """Accepted for compatibility: fiber connections are always picklable."""
