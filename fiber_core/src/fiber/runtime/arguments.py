"""Checks of the arguments of fiber's public callables, made at the call.

Where multiprocessing checks an argument, the check here raises what multiprocessing
raises, with its message (a pool's size: ``ValueError("Number of processes must be at
least 1")``, the ``TypeError`` of comparing a ``str`` with an int, the ``TypeError`` of
using a ``float`` as an integer). Where multiprocessing takes a bad value without a
word and then hangs or loses work (a ``float`` chunk size, ``map(..., chunksize=0)``,
a callback that is not callable), fiber raises at the call instead; each such
difference is listed in docs/bad-inputs.md, which a test builds from a run.

The checks run in the caller's thread, before anything is started: a value that
reached the pool's threads (its supervisor, its starters) would kill them and leave
the caller waiting.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["pool_size", "chunksize", "positive_int", "callable_or_none", "queue_maxsize"]


def pool_size(processes: Any) -> int:
    """A pool's number of workers (``Pool(processes)``, ``Pool.resize``), checked as
    multiprocessing.Pool checks it: below 1 is ``ValueError``, a value that cannot be
    compared with 1 (a ``str``) or is not an integer (a ``float``) ``TypeError``."""
    if processes < 1:  # a str raises multiprocessing's TypeError here
        raise ValueError("Number of processes must be at least 1")
    return int(operator.index(processes))  # a float: multiprocessing's TypeError


def chunksize(value: Any) -> int:
    """A map's or imap's chunk size (not None): an integer of at least 1. As imap's
    in multiprocessing: ``ValueError("Chunksize must be 1+, not 0")``; a ``float`` is a
    ``TypeError`` (multiprocessing's map hangs on one, its imap raises ``ValueError``
    from ``islice``)."""
    if value < 1:  # a str: TypeError, as multiprocessing's
        raise ValueError(f"Chunksize must be 1+, not {value}")
    return int(operator.index(value))


def positive_int(name: str, value: Any) -> int:
    """A fiber extension's count (``min_processes``, ``max_task_attempts``, ...): an
    integer (not a bool) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, not {value}")
    return value


def callable_or_none(name: str, value: Any) -> None:
    """A callback (``callback``, ``error_callback``): None or a callable."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be a callable or None, not {type(value).__name__}")


def queue_maxsize(maxsize: Any) -> int:
    """A queue's bound, as multiprocessing's: 0 or less means unbounded; a ``str`` or a
    ``float`` is multiprocessing's ``TypeError``."""
    if maxsize <= 0:  # a str: TypeError, as multiprocessing's
        return 0
    return int(operator.index(maxsize))
