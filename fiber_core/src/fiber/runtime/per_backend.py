"""One object per backend instance in this process (its job monitor, its submitter),
made on first use and found again by the backend's identity."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from fiber.backend import Backend

T = TypeVar("T")

__all__ = ["PerBackend"]


class PerBackend(Generic[T]):
    """``per(backend)`` is the object ``make(backend)`` made for this backend instance
    (made now if none was, or if the one kept was for another backend that had the same
    ``id``). With ``forget_after_fork``, a forked child starts with none: the objects
    are its parent's, with threads that did not cross the fork."""

    def __init__(self, make: Callable[[Backend], T], forget_after_fork: bool = False) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: dict[int, tuple[Backend, T]] = {}
        if forget_after_fork:
            os.register_at_fork(after_in_child=self._forget)

    def __call__(self, backend: Backend) -> T:
        with self._lock:
            found = self._made.get(id(backend))
            if found is None or found[0] is not backend:
                found = self._made[id(backend)] = (backend, self._make(backend))
            return found[1]

    def get(self, backend: Backend) -> T | None:
        """The object made for ``backend``, None when none was."""
        with self._lock:
            found = self._made.get(id(backend))
        return found[1] if found is not None and found[0] is backend else None

    def made(self) -> list[T]:
        """Every object made so far."""
        with self._lock:
            return [obj for _, obj in self._made.values()]

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._made.clear()
