"""What killed processes leave in :data:`~fiber.wire.shm.segment.DIRECTORY`, found
(:func:`leftovers`, which ``fiber clean`` lists) and removed (:func:`sweep`): message
segments nobody can receive or reuse any more, and the files and named semaphores of
shared objects whose creator has ended. When the sweep runs: see :mod:`fiber.wire.shm`."""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Collection
from dataclasses import dataclass

from fiber.wire.shm import segment
from fiber.wire.shm.segment import FREE, POOLED, SEGMENT_NAME, STATE_NAME, alive

logger = logging.getLogger("fiber.shm")

__all__ = ["Leftover", "leftovers", "remove_leftover", "sweep", "last_sweep"]

_last_sweep = 0.0


def last_sweep() -> float:
    """When this process last swept (``time.monotonic()``; 0: never)."""
    return _last_sweep


@dataclass(frozen=True)
class Leftover:
    """A file of :data:`DIRECTORY` that nobody can use any more (:func:`leftovers`)."""

    name: str
    size: int  # bytes
    pids: tuple[int, ...]  # the processes its name names (owner, sender or creator)
    semaphore: bool  # a named semaphore ("sem." + name) of a shared object


def _segment_left(name: str, owner: int, sender: int) -> bool:
    """Whether message segment ``name`` of mailbox ``owner`` and sender ``sender``
    (not both alive) can go: a one-off message whose mailbox is gone; a pooled segment
    of a sender that is gone, free and unmapped, or whose mailbox is gone too."""
    try:
        fd = os.open(segment.path(name), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        header = os.pread(fd, 2, 0)
        if header[1:2] != bytes([POOLED]):
            return not alive(owner)
        if sender == os.getpid() or alive(sender):
            return False  # its sender's pool takes care of it
        if header[:1] == bytes([FREE]):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (dropped with the fd)
            except BlockingIOError:
                return False  # a receiver still maps it: it unlinks it when done
            return True
        return not alive(owner)
    finally:
        os.close(fd)


def leftovers(pids: Collection[int] | None = None) -> list[Leftover]:
    """The files of this pid namespace's fiber segments and shared objects that nobody
    can use any more (what :func:`sweep` removes), or only those whose names name one
    of ``pids``: message segments of ended processes (see :func:`sweep`), and the
    files and named semaphores of shared objects whose creator has ended."""
    try:
        names = os.listdir(segment.DIRECTORY)
        pidns = str(segment.pidns())
    except OSError:
        return []
    found = []
    for name in names:
        if (state := STATE_NAME.match(name)) and state.group(1) == pidns:
            named: tuple[int, ...] = (int(state.group(2)),)
            left = not alive(named[0])
        elif (match := SEGMENT_NAME.match(name)) and match.group(1) == pidns:
            owner, sender = int(match.group(2)), int(match.group(3))
            named = (owner, sender)
            left = not (alive(owner) and alive(sender)) and _segment_left(name, owner,
                                                                          sender)
        else:
            continue
        if not left or (pids is not None and not set(named) & set(pids)):
            continue
        try:
            size = os.stat(segment.path(name)).st_size
        except OSError:
            continue  # removed meanwhile
        found.append(Leftover(name, size, named, name.startswith("sem.")))
    return found


def remove_leftover(left: Leftover) -> bool:
    """Unlink a file :func:`leftovers` found; whether this call removed it."""
    try:
        os.unlink(segment.path(left.name))
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("cannot remove %s: %s", segment.path(left.name), exc)
        return False
    return True


def sweep(pids: Collection[int] | None = None) -> int:
    """Remove the segments (of this pid namespace) that nobody can use any more
    (:func:`leftovers`; only those naming one of ``pids`` when given): a one-off
    message of a mailbox whose process is gone; a pooled segment of a sender that is
    gone, when it is free and unmapped or its message's mailbox is gone too; the names
    of shared objects whose creator is gone (:func:`~fiber.wire.shm.state_name`:
    processes that attached to them keep them). Returns how many."""
    global _last_sweep
    _last_sweep = time.monotonic()
    removed = sum(remove_leftover(left) for left in leftovers(pids))
    if removed:
        logger.debug("removed %d shared-memory segments of ended processes", removed)
    return removed
