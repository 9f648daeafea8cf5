"""This process's segments as a sender: a pool of up to :data:`POOL_SLOTS` mapped
segments per destination process, reused while free, and one-off segments when the
pool is busy or the message too big (:func:`write`); their end (:func:`close_pool`, at
exit and for destinations that have gone), the fresh pool of a forked child, and the
cleanup of a process that used shared memory at all (:func:`mark_used`: the sweep every
:data:`SWEEP_INTERVAL` seconds and at exit)."""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from collections.abc import Sequence

from fiber import util
from fiber.wire.shm.segment import (
    FREE,
    IN_FLIGHT,
    ONE_OFF,
    POOLED,
    alive,
    layout,
    logger,
    new_name,
    path,
    unlink,
)
from fiber.wire.shm.sweep import last_sweep, sweep

__all__ = ["SWEEP_INTERVAL", "POOL_SLOTS", "POOL_MAX_SEGMENT", "POOL_MAX_BYTES", "write",
           "close_pool", "used", "mark_used"]

SWEEP_INTERVAL = 60.0
POOL_SLOTS = 3  # pooled segments per destination process
POOL_MAX_SEGMENT = 1 << 30  # bigger messages go one-off
POOL_MAX_BYTES = 1 << 30  # pooled bytes per sending process

_used = False  # this process made, opened or kept a segment


class _Slot:
    """A pooled segment of this (sending) process, mapped here."""

    __slots__ = ("name", "fd", "map", "size")

    def __init__(self, name: str, fd: int, size: int) -> None:
        self.name, self.fd = name, fd
        self.map = self._mapping(size)
        self.size = size

    def _mapping(self, size: int) -> mmap.mmap:
        os.posix_fallocate(self.fd, 0, size)  # ENOSPC now rather than SIGBUS later
        return mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def grow(self, size: int) -> None:
        if size <= self.size:
            return
        mapping = self._mapping(size)
        self.map.close()
        self.map, self.size = mapping, size

    def take(self) -> bool:
        """Lock the segment for writing if no message is in it and nobody maps it."""
        mapping = self.map
        assert mapping is not None  # mapped by grow() from the start
        if mapping[0] != FREE:
            return False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def fill(self, buffers: Sequence[memoryview], offsets: Sequence[int]) -> None:
        mapping = self.map
        assert mapping is not None  # mapped by grow() from the start
        for buf, offset in zip(buffers, offsets, strict=True):
            mapping[offset:offset + buf.nbytes] = buf
        mapping[1] = POOLED
        mapping[0] = IN_FLIGHT
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


_pools: dict[int, list[_Slot]] = {}
_pool_bytes = 0
_pool_lock = threading.Lock()


def _as_bytes(buf: memoryview) -> memoryview:
    return buf.cast("B") if buf.format != "B" or buf.ndim != 1 else buf


def write(owner_pid: int, buffers: Sequence[memoryview]) -> tuple[str, list[int]] | None:
    """Put ``buffers`` into a segment for a mailbox of process ``owner_pid``; the
    segment's name and the buffers' offsets, or None when shared memory cannot take
    them (full, missing), in which case the caller sends bytes."""
    mark_used()
    _maybe_sweep()
    buffers = [_as_bytes(b) for b in buffers]
    offsets, total = layout([b.nbytes for b in buffers])
    if total <= POOL_MAX_SEGMENT:
        try:
            name = _write_pooled(owner_pid, buffers, offsets, total)
        except OSError as exc:
            logger.debug("cannot use a pooled segment for %d bytes: %s", total, exc)
            name = None
        if name is not None:
            return name, offsets
    name = _write_one_off(owner_pid, buffers, offsets, total)
    return None if name is None else (name, offsets)


def _write_pooled(owner_pid: int, buffers: Sequence[memoryview], offsets: Sequence[int],
                  total: int) -> str | None:
    global _pool_bytes
    with _pool_lock:
        pool = _pools.setdefault(owner_pid, [])
        for slot in sorted(pool, key=lambda s: (s.size < total, s.size)):
            if slot.take():
                break
        else:
            if len(pool) >= POOL_SLOTS or _pool_bytes + total > POOL_MAX_BYTES:
                return None
            name = new_name(owner_pid)
            fd = os.open(path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
                         0o600)
            try:
                slot = _Slot(name, fd, total)
            except OSError:
                os.close(fd)
                unlink(name)
                raise
            pool.append(slot)
            _pool_bytes += slot.size
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            before = slot.size
            if total > before and _pool_bytes + total - before > POOL_MAX_BYTES:
                fcntl.flock(slot.fd, fcntl.LOCK_UN)
                return None
            slot.grow(total)
            _pool_bytes += slot.size - before
            slot.fill(buffers, offsets)
        except OSError:
            fcntl.flock(slot.fd, fcntl.LOCK_UN)
            raise
        return slot.name


def _write_one_off(owner_pid: int, buffers: Sequence[memoryview], offsets: Sequence[int],
                   total: int) -> str | None:
    name = new_name(owner_pid)
    try:
        fd = os.open(path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        logger.debug("cannot create %s: %s", name, exc)
        return None
    try:
        os.ftruncate(fd, total)
        os.pwrite(fd, bytes([IN_FLIGHT, ONE_OFF]), 0)
        for view, offset in zip(buffers, offsets, strict=True):
            done = 0
            while done < view.nbytes:
                done += os.pwrite(fd, view[done:], offset + done)
    except OSError as exc:  # e.g. ENOSPC: /dev/shm is small in containers
        logger.debug("cannot write %d bytes to %s: %s", total, name, exc)
        unlink(name)
        return None
    finally:
        os.close(fd)
    return name


def close_pool(dead_owners_only: bool = False) -> None:
    """Unlink this process's pooled segments (at exit), or those for mailboxes of
    processes that are gone. A message still in flight to a live mailbox stays: its
    receiver or mailbox unlinks it once this process is gone. (A receiver that maps a
    segment keeps its pages when the name goes.)"""
    global _pool_bytes
    with _pool_lock:
        owners = [o for o in _pools if not dead_owners_only or not alive(o)]
        pools = {owner: _pools.pop(owner) for owner in owners}
        _pool_bytes -= sum(slot.size for pool in pools.values() for slot in pool)
    for owner, pool in pools.items():
        for slot in pool:
            if slot.map is None or slot.map[0] != IN_FLIGHT or not alive(owner):
                unlink(slot.name)
            slot.close()


def _maybe_sweep() -> None:
    last = last_sweep()
    if time.monotonic() - last > SWEEP_INTERVAL or not last:
        close_pool(dead_owners_only=True)
        sweep()


def _forget_pool_after_fork() -> None:
    """A forked child must not write into its parent's segments (it shares their
    locks): it starts a pool of its own."""
    global _pool_bytes, _pool_lock
    _pool_lock = threading.Lock()
    for pool in _pools.values():
        for slot in pool:
            try:
                slot.close()
            except (OSError, BufferError):
                pass
    _pools.clear()
    _pool_bytes = 0


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def used() -> bool:
    """Whether this process made, opened or kept a segment (then it cleans up at its
    exit)."""
    return _used


def mark_used() -> None:
    """This process made or mapped a segment: clean up at its exit."""
    global _used
    if not _used:
        _used = True
        util.at_exit("shared memory", util.SHARED_MEMORY, _at_exit)


def _at_exit() -> None:
    # Only the main process of a run gets here (fiber children leave by os._exit), in
    # the exit path's order: after its children were joined and its mailboxes dropped
    # their unread items (see fiber.util).
    close_pool()
    sweep()
