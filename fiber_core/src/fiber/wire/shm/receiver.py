"""This process's segments as a receiver: a received message's segment mapped
(:func:`attach`: a one-off one unlinked at once, a pooled one locked and marked taken
while its arrays live), or given back unread (:func:`drop`)."""

from __future__ import annotations

import fcntl
import mmap
import os
import weakref

from fiber.wire.shm.pool import mark_used
from fiber.wire.shm.segment import (
    FREE,
    POOLED,
    SEGMENT_NAME,
    SegmentError,
    path,
    sender_gone,
    unlink,
)

__all__ = ["attach", "drop"]


def _release(fd: int, name: str) -> None:
    """The receiver's arrays of a pooled segment are gone."""
    os.close(fd)  # drops the shared lock: the sender may reuse it
    if sender_gone(name):
        unlink(name)


def attach(name: str, size: int) -> mmap.mmap:
    """Map the ``size`` bytes of segment ``name`` of a received message: a one-off
    segment is unlinked at once, a pooled one is locked and marked taken until the
    mapping is garbage collected."""
    mark_used()
    if not SEGMENT_NAME.match(name):
        raise SegmentError(f"not a fiber shared-memory segment name: {name!r}")
    try:
        fd = os.open(path(name), os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise SegmentError(
            f"cannot open the shared-memory segment {path(name)} of a received message: "
            f"{exc}. Its mailbox's process may have exited, or this process does not "
            "share /dev/shm with the sender (set FIBER_SHARED_MEMORY=false on both sides to send bytes)"
        ) from None
    try:
        if os.pread(fd, 2, 0)[1:2] != bytes([POOLED]):
            unlink(name)
            try:
                return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
        fcntl.flock(fd, fcntl.LOCK_SH)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mapping[0] = FREE  # taken: the sender waits for our lock to go
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(mapping, _release, fd, name)
    return mapping


def drop(name: str) -> None:
    """A message in segment ``name`` will never be received."""
    if not SEGMENT_NAME.match(name):
        return
    try:
        fd = os.open(path(name), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        pooled = os.pread(fd, 2, 0)[1:2] == bytes([POOLED])
        if pooled and not sender_gone(name):
            os.pwrite(fd, bytes([FREE]), 0)  # the sender may reuse it
            return
    finally:
        os.close(fd)
    unlink(name)


