"""The arguments of :class:`fiber.Pool` and :meth:`fiber.Pool.adapt`, checked: the
pool's size and its bounds (:class:`Bounds`, :func:`pool_arguments`), and adapt's,
turned into the adaptive policy's :class:`~fiber.runtime.pool.adapt_policy.Settings`
(:func:`adapt_settings`).

Every wrong value raises here, in the caller's thread, before anything starts, as
multiprocessing's checks do: ``TypeError`` for a value of the wrong type,
``ValueError`` for one out of bounds, each naming the argument.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fiber.runtime import arguments, run

if TYPE_CHECKING:  # loaded by the first adapt(), as the adapt driver
    from fiber.runtime.pool.adapt_policy import Settings


@dataclass(frozen=True)
class Bounds:
    """A pool's ``min_processes`` (``least``; ``least_given``: by the caller) and
    ``max_processes`` (``most``; None: unbounded)."""

    least: int = 1
    least_given: bool = False
    most: int | None = None

    def check(self, n: int) -> None:
        """Raise ``ValueError`` if the size ``n`` is outside the bounds."""
        if n < self.least or (self.most is not None and n > self.most):
            raise ValueError(f"pool size {n} is outside its bounds "
                             f"[{self.least}, {self.most or 'unbounded'}]")


def pool_arguments(processes: Any, maxtasksperchild: Any, initializer: Any,
                   min_processes: Any, max_processes: Any,
                   max_task_attempts: Any) -> tuple[int, Bounds]:
    """``Pool()``'s size (None: the CPUs here) and its bounds, each argument checked."""
    if processes is None:
        processes = os.cpu_count() or 1
    # checked here as multiprocessing checks it (a float reaching the supervisor
    # thread killed it, and map waited for ever)
    processes = arguments.pool_size(processes)
    if maxtasksperchild is not None and (
            not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
        raise ValueError("maxtasksperchild must be a positive int or None")
    if initializer is not None and not callable(initializer):
        raise TypeError("initializer must be a callable")
    bounds = Bounds(
        1 if min_processes is None else arguments.positive_int("min_processes", min_processes),
        min_processes is not None,
        None if max_processes is None else arguments.positive_int("max_processes",
                                                                  max_processes))
    if max_task_attempts is not None:
        arguments.positive_int("max_task_attempts", max_task_attempts)
    bounds.check(processes)
    return processes, bounds


def workers_per_job(value: Any) -> None:
    """``Pool(workers_per_job=)``: a positive int."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"workers_per_job must be a positive int, not {value!r}")


def callbacks(callback: object, error_callback: object) -> None:
    """Callbacks are checked at the call (multiprocessing's result thread dies on one
    that is not callable, and its pool hangs)."""
    if callback is None and error_callback is None:
        return  # (an apply_async's usual case: no call more)
    arguments.callable_or_none("callback", callback)
    arguments.callable_or_none("error_callback", error_callback)


def count(name: str, value: Any, least: int) -> int:
    """An int (not a bool) of at least ``least`` (adapt's bounds)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be at least {least}, not {value}")
    return value


def seconds(name: str, value: Any, *, allow_zero: bool) -> float:
    """A finite real number, positive (or 0 with ``allow_zero``): adapt's knobs."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number "
                         f"{'of at least 0' if allow_zero else 'above 0'}, not {value}")
    return float(value)


def check_placements(placements: object) -> tuple[list[Any], tuple[int, ...]]:
    """adapt's ``placements``: (fiber context, maximum) pairs, at least one."""
    wrong = TypeError("placements must be a list of (context, maximum) pairs: a fiber "
                      "context (fiber.get_context(name)) and an int")
    if isinstance(placements, (str, bytes)) or not isinstance(placements, Iterable):
        raise wrong
    contexts, caps = [], []
    for item in placements:
        if not isinstance(item, tuple) or len(item) != 2 or not run.carries(item[0]):
            raise wrong
        contexts.append(item[0])
        caps.append(count("a placement's maximum", item[1], 1))
    if not contexts:
        raise ValueError("placements must name at least one (context, maximum)")
    return contexts, tuple(caps)


def adapt_settings(minimum: Any, maximum: Any, idle_timeout: Any, growth: Any,
                   placements: object, *, size: int,
                   bounds: Bounds) -> tuple[Settings, list[Any]]:
    """The settings of ``Pool.adapt(minimum, maximum, idle_timeout=, growth=,
    placements=)`` on a pool of ``size`` workers within ``bounds``; and the contexts
    of ``placements`` (empty: the pool's own). ``maximum`` defaults to the placements'
    maxima together, else to ``max_processes``, else to ``size``."""
    from fiber.runtime.pool.adapt_policy import Settings

    most = bounds.most
    minimum = count("minimum", minimum, 0)
    caps: tuple[int, ...] = ()
    contexts: list[Any] = []
    if placements is not None:
        contexts, caps = check_placements(placements)
        if maximum is None:
            maximum = sum(caps)
        elif maximum > sum(caps):
            raise ValueError(f"maximum ({maximum}) is above the placements' maxima "
                             f"together ({sum(caps)})")
    if maximum is None:
        maximum = most if most is not None else size
    maximum = count("maximum", maximum, 1)
    if maximum < minimum:
        raise ValueError(f"maximum ({maximum}) must be at least minimum ({minimum})")
    if most is not None and maximum > most:
        raise ValueError(f"maximum ({maximum}) is above the pool's max_processes ({most})")
    if bounds.least_given and minimum < bounds.least:
        raise ValueError(f"minimum ({minimum}) is below the pool's min_processes "
                         f"({bounds.least})")
    return Settings(minimum, maximum, seconds("idle_timeout", idle_timeout, allow_zero=True),
                    seconds("growth", growth, allow_zero=False), caps), contexts
