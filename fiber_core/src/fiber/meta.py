"""``@fiber.meta``: resource requests attached to a process's target function.

The module is callable as the function: once something imports it as a module (a
local forkserver template imports every module its parent has), ``fiber.meta`` is
this module, and ``@fiber.meta(...)`` must still work.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fiber.backend.resources import Resources

F = TypeVar("F", bound=Callable[..., Any])


def meta(*, cpu: float | None = None, memory: int | str | None = None,
         gpu: int | None = None, walltime: int | str | None = None,
         extra: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """Request resources for the job that runs the decorated function as a
    Process target: ``@fiber.meta(cpu=2, memory="4G", gpu=1)``, with the fields of
    :class:`fiber.Resources` (``walltime="1:00:00"``, ``extra={"slurm": {"partition":
    "debug"}}``). Values are validated at once; the backend checks at ``start()``
    that it can honour them (see :meth:`fiber.backend.Backend.check_resources`). A
    Process's own ``resources=`` win over these, these over the settings."""
    asked: dict[str, Any] = {"cpu": cpu, "memory": memory, "gpu": gpu,
                             "walltime": walltime, "extra": extra or {}}
    given = Resources(**asked)  # validates (sizes and times as text are parsed)
    requests: dict[str, Any] = {
        name: getattr(given, name) for name in ("cpu", "memory", "gpu", "walltime")
        if getattr(given, name) is not None}
    if extra:
        requests["extra"] = {name: dict(values) for name, values in given.extra.items()}

    def decorate(func: F) -> F:
        target: Any = func  # any callable: the requests go in an attribute of its own
        target.__fiber_meta__ = {**getattr(func, "__fiber_meta__", {}), **requests}
        return func

    return decorate


class _CallableModule(types.ModuleType):
    def __call__(self, **requests: Any) -> Callable[[F], F]:
        return meta(**requests)


sys.modules[__name__].__class__ = _CallableModule
