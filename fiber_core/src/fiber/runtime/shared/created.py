"""The names of shared objects this process created and has not unlinked yet (blocks
of ``/dev/shm``, named semaphores): each is unlinked once, by whoever takes it first
(the object's collection, an explicit ``unlink()``, or the exit path)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["CreatedNames"]


class CreatedNames:
    """A thread-safe set of names: :meth:`take` and :meth:`take_all` hand each name
    out once, to the caller that unlinks it; :meth:`unlink` and :meth:`unlink_all` do
    so with ``remove(name)``."""

    def __init__(self, remove: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._remove = remove

    def add(self, name: str) -> None:
        with self._lock:
            self._names.add(name)

    def take(self, name: str) -> bool:
        """Whether ``name`` was here (it is not any more: the caller unlinks it)."""
        with self._lock:
            if name not in self._names:
                return False
            self._names.discard(name)
            return True

    def take_all(self) -> list[str]:
        """Every name still here, sorted (none is left: the caller unlinks them)."""
        with self._lock:
            names = sorted(self._names)
            self._names.clear()
            return names

    def unlink(self, name: str) -> None:
        """Remove ``name`` if this process created it and has not unlinked it yet."""
        if self.take(name) and self._remove is not None:
            self._remove(name)

    def unlink_all(self) -> None:
        """At exit: remove every name created here and not unlinked yet."""
        for name in self.take_all():
            if self._remove is not None:
                self._remove(name)
