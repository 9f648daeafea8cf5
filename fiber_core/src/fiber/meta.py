"""``@fiber.meta``: resource requests attached to a process's target function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fiber.backend.options import parse_memory, parse_nonnegative_int, parse_positive_float

F = TypeVar("F", bound=Callable[..., Any])


def meta(*, cpu: float | None = None, memory: int | str | None = None,
         gpu: int | None = None) -> Callable[[F], F]:
    """Request resources for the job that runs the decorated function as a
    Process target: ``@fiber.meta(cpu=2, memory="4G", gpu=1)``. Values are
    validated at once; backends that cannot enforce a request ignore it (see the
    backend's documentation)."""
    requests: dict[str, Any] = {}
    if cpu is not None:
        requests["cpu"] = parse_positive_float(cpu)
    if memory is not None:
        requests["memory"] = parse_memory(memory)
    if gpu is not None:
        requests["gpu"] = parse_nonnegative_int(gpu)

    def decorate(func: F) -> F:
        target: Any = func  # any callable: the requests go in an attribute of its own
        target.__fiber_meta__ = {**getattr(func, "__fiber_meta__", {}), **requests}
        return func

    return decorate
