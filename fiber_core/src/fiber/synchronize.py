"""Synchronization primitives usable by every process of a run, as
:mod:`multiprocessing.synchronize`: :func:`Lock`, :func:`RLock`, :func:`Semaphore`,
:func:`BoundedSemaphore`, :func:`Condition`, :func:`Event` and :func:`Barrier`.

Today each primitive is an object of a :class:`~fiber.managers.SyncManager` this
process starts on first use (:mod:`fiber.runtime.managers.implicit`; stop it with
:func:`fiber.managers.shutdown_implicit_manager`), and what it returns is a proxy
with the methods of the :mod:`threading` type of the same name: every operation is a
network round trip to that manager (about 0.4-0.5 ms on the local backend of a
2-core machine, measured by tests/portable/test_managers.py), not a shared-memory
access. The primitives pickle, so they can be passed to fiber Processes and Pools.

This module is the one place that decides how a primitive is made (:func:`_maker`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fiber.managers import Manager, SyncManager
from fiber.runtime.managers import implicit

__all__ = ["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event",
           "Barrier"]


def _maker() -> SyncManager:
    """What makes the primitives: this process's implicit manager."""
    return implicit.get(Manager)


def Lock() -> threading.Lock:
    """A lock usable by every process of the run."""
    return _maker().Lock()


def RLock() -> threading.RLock:
    """A reentrant lock usable by every process of the run."""
    return _maker().RLock()


def Semaphore(value: int = 1) -> threading.Semaphore:
    """A semaphore usable by every process of the run."""
    return _maker().Semaphore(value)


def BoundedSemaphore(value: int = 1) -> threading.BoundedSemaphore:
    """A bounded semaphore usable by every process of the run."""
    return _maker().BoundedSemaphore(value)


def Condition(lock: Any = None) -> threading.Condition:
    """A condition variable usable by every process of the run (``lock``, if given,
    must be a lock of the same manager, e.g. from :func:`Lock`)."""
    return _maker().Condition(lock)


def Event() -> threading.Event:
    """An event usable by every process of the run."""
    return _maker().Event()


def Barrier(parties: int, action: Callable[[], None] | None = None,
            timeout: float | None = None) -> threading.Barrier:
    """A barrier usable by every process of the run."""
    return _maker().Barrier(parties, action, timeout)
