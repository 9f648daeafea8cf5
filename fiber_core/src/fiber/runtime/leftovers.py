"""What ended programs left on this machine, found and removed for ``fiber jobs`` and
``fiber clean``.

A program killed with SIGKILL never runs its exit path, so what that path removes
stays: its shared-memory segments and the files and named semaphores of its shared
objects in ``/dev/shm`` (:func:`fiber.wire.shm.leftovers`: only those no running process
can use), and the local backend's log directories (:func:`fiber.backend.local.records.
ended_log_directories`: only those whose creator has ended and no running job writes
to). Each is named after the process that made it, so what belongs to a run is what
names one of its recorded main processes (:mod:`fiber.runtime.runs`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from fiber.backend.local import records
from fiber.wire import shm

__all__ = ["Leftovers", "find", "remove"]


def _size(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


@dataclass
class Leftovers:
    """Files of ended programs: shared memory and semaphores, log directories."""

    shm: list[shm.Leftover] = field(default_factory=list)
    log_directories: list[records.LogDirectory] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.shm or self.log_directories)

    def describe(self) -> str:
        """E.g. ``20 shared-memory segments (87.3 MB) and 2 log directories (4.1 kB)``."""
        segments = [s for s in self.shm if not s.semaphore]
        semaphores = len(self.shm) - len(segments)
        parts = []
        if segments:
            parts.append(_count(len(segments), "shared-memory segment",
                                "shared-memory segments")
                         + f" ({_size(sum(s.size for s in segments))})")
        if semaphores:
            parts.append(_count(semaphores, "semaphore", "semaphores"))
        if self.log_directories:
            parts.append(_count(len(self.log_directories), "log directory",
                                "log directories")
                         + f" ({_size(sum(d.size for d in self.log_directories))})")
        if not parts:
            return "nothing"
        return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def find(pids: Collection[int] | None = None) -> Leftovers:
    """What ended programs left on this machine, or only what names one of ``pids``."""
    directories = records.ended_log_directories()
    if pids is not None:
        directories = [d for d in directories if d.creator in pids]
    return Leftovers(shm.leftovers(pids), directories)


def remove(pids: Collection[int] | None = None) -> Leftovers:
    """Remove what :func:`find` finds; returns what was removed."""
    removed = Leftovers()
    for left in shm.leftovers(pids):
        if shm.remove_leftover(left):
            removed.shm.append(left)
    for directory in find(pids).log_directories:
        if records.remove_log_directory(directory):
            removed.log_directories.append(directory)
    return removed
