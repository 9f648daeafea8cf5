"""Shared-memory segments for the large out-of-band buffers of queue and pipe messages.

When a message's out-of-band buffers (pickle protocol 5: numpy arrays...) total at
least :data:`THRESHOLD` bytes and the queue or pipe lives in a process of the same
host, the sender copies them into a file in ``/dev/shm`` and sends only a small
descriptor; the receiver maps the file, and the arrays it gets are backed by that
mapping (no copy on receive).

Two kinds of segments (byte 1 of a segment's 64-byte header):

* *Pooled*: each sender keeps up to :data:`POOL_SLOTS` segments per destination
  process mapped and reuses them, so sending is one ``memcpy`` into warm pages. Byte 0
  of the header says whether a message is in flight. The receiver takes a shared
  ``flock`` on the segment, marks it taken and holds the lock as long as the arrays
  live (the lock goes with the mapping's file descriptor, and the kernel drops it when
  the receiver dies). The sender reuses a segment only when it is marked free and it
  gets the exclusive lock. A mailbox that drops an unread message marks it free.
* *One-off* (the pool is busy or the message is too big for it): written with
  ``pwrite``; the receiver unlinks it when it opens it.

Names are ``fiber-<pid namespace>-<mailbox owner pid>-<sender pid>-<random>``.
Cleanup: whoever takes a one-off message out of its mailbox unlinks it (the receiver;
the mailbox's owner when the queue is garbage collected, the pipe end that would read
it is closed, or the reader is on another host and gets the bytes inline). A pooled
segment is unlinked by its sender at exit when free, else by the last user after the
sender is gone (the receiver releasing its arrays, the mailbox dropping the message).
What a killed process leaves behind (a sender's free segments, a dead mailbox's
messages) is removed by :func:`sweep`, which runs when a process creates its hub
(:func:`fiber.wire.transport.get_hub`: any fiber program of the machine cleans up after
killed ones, whether or not it moves large arrays itself), at the main process's exit
(:mod:`fiber.util`'s exit path), every :data:`SWEEP_INTERVAL` seconds in a process
that creates segments, and by ``fiber clean`` (which lists them first with
:func:`leftovers`, the sweep's decision without the unlink).

"Same host" means same boot, same ``/dev/shm`` file system and same pid namespace
(:func:`host_token`); anything else falls back to bytes over the wire. The
``shared_memory`` setting (``FIBER_SHARED_MEMORY=false``, :func:`enable`) turns the
shared-memory path off for a process and its children.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fiber import util

logger = logging.getLogger("fiber.shm")

DIRECTORY = "/dev/shm"
THRESHOLD = 1 << 20  # out-of-band bytes of one message from which shared memory is used
ALIGN = 64  # buffers start at multiples of this in a segment
SWEEP_INTERVAL = 60.0
_NAME = re.compile(r"fiber-(\d+)-(\d+)-(\d+)-[0-9a-f]{16}\Z")
# shared objects (fiber.synchronize, fiber.sharedctypes, fiber.shared_memory): files
# and named semaphores ("sem." + name) of their creator
_STATE_NAME = re.compile(r"(?:sem\.)?fiber-st-(\d+)-(\d+)-[0-9a-f]{16}\Z")
HEADER = 64  # byte 0: a message is in flight; byte 1: pooled
IN_FLIGHT, FREE = 1, 0
POOLED, ONE_OFF = 1, 0
POOL_SLOTS = 3  # pooled segments per destination process
POOL_MAX_SEGMENT = 1 << 30  # bigger messages go one-off
POOL_MAX_BYTES = 1 << 30  # pooled bytes per sending process

_lock = threading.Lock()
_token: bytes | None = None
_token_known = False
_disabled = False  # the shared_memory setting is off
_last_sweep = 0.0
_used = False  # this process made, opened or kept a segment


class SegmentError(OSError):
    """A shared-memory segment named in a message cannot be opened."""


def _compute_token() -> bytes | None:
    if _disabled:
        return None
    if os.environ.get("_FIBER_SHM", "1").strip().lower() in ("0", "off", "no", "false"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        shm = os.stat(DIRECTORY)
        pidns = os.stat("/proc/self/ns/pid").st_ino
        if not os.access(DIRECTORY, os.W_OK | os.X_OK):
            return None
    except OSError:
        return None
    return f"{boot}:{shm.st_dev}:{shm.st_ino}:{pidns}".encode()


def host_token() -> bytes | None:
    """What identifies this host's shared memory (None: not usable here)."""
    global _token, _token_known
    if not _token_known:
        with _lock:
            if not _token_known:
                _token = _compute_token()
                _token_known = True
    return _token


def enable(on: bool) -> None:
    """Use shared memory with the processes of this host (the ``shared_memory``
    setting), or not: then this process is "on another host" for every other one."""
    global _disabled, _token_known
    with _lock:
        if _disabled == (not on):
            return
        _disabled = not on
        _token_known = False


def set_host_token(token: bytes | None) -> None:
    """Pretend to be on another host (``token``) or turn shared memory off (None);
    for tests of the fallback path."""
    global _token, _token_known
    with _lock:
        _token, _token_known = token, True


def _pidns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of buffers of ``sizes`` in one segment (after its header), and its
    total size."""
    offsets, end = [], HEADER
    for size in sizes:
        end = -(-end // ALIGN) * ALIGN
        offsets.append(end)
        end += size
    return offsets, end


def _path(name: str) -> str:
    return os.path.join(DIRECTORY, name)


def _new_name(owner_pid: int) -> str:
    return f"fiber-{_pidns()}-{owner_pid}-{os.getpid()}-{secrets.token_hex(8)}"


def state_name() -> str:
    """A new name for a shared object this process creates: a file of
    :data:`DIRECTORY`, or a named semaphore (``"/" + name``, whose file is
    ``sem.<name>``). :func:`sweep` removes it once this process is gone."""
    return f"fiber-st-{_pidns()}-{os.getpid()}-{secrets.token_hex(8)}"


def state_names(pid: int | None = None) -> list[str]:
    """The files of the shared objects of this pid namespace that exist, or only those
    created by process ``pid`` (for tests)."""
    pidns = str(_pidns())
    try:
        names = os.listdir(DIRECTORY)
    except OSError:
        return []
    return sorted(name for name in names
                  if (m := _STATE_NAME.match(name)) and m.group(1) == pidns
                  and (pid is None or m.group(2) == str(pid)))


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
    _mark_used()
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
            name = _new_name(owner_pid)
            fd = os.open(_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC,
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
    name = _new_name(owner_pid)
    try:
        fd = os.open(_path(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
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


def _sender_gone(name: str) -> bool:
    match = _NAME.match(name)
    return match is not None and not _alive(int(match.group(3)))


def _release(fd: int, name: str) -> None:
    """The receiver's arrays of a pooled segment are gone."""
    os.close(fd)  # drops the shared lock: the sender may reuse it
    if _sender_gone(name):
        unlink(name)


def attach(name: str, size: int) -> mmap.mmap:
    """Map the ``size`` bytes of segment ``name`` of a received message: a one-off
    segment is unlinked at once, a pooled one is locked and marked taken until the
    mapping is garbage collected."""
    _mark_used()
    if not _NAME.match(name):
        raise SegmentError(f"not a fiber shared-memory segment name: {name!r}")
    try:
        fd = os.open(_path(name), os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise SegmentError(
            f"cannot open the shared-memory segment {_path(name)} of a received message: "
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
    if not _NAME.match(name):
        return
    try:
        fd = os.open(_path(name), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        pooled = os.pread(fd, 2, 0)[1:2] == bytes([POOLED])
        if pooled and not _sender_gone(name):
            os.pwrite(fd, bytes([FREE]), 0)  # the sender may reuse it
            return
    finally:
        os.close(fd)
    unlink(name)


def unlink(name: str) -> None:
    """Remove segment ``name`` (nothing if it is gone already)."""
    if not _NAME.match(name):
        return
    try:
        os.unlink(os.path.join(DIRECTORY, name))
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove shared-memory segment %s: %s", name, exc)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` (of this pid namespace) runs; a zombie does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rpartition(b")")[2][1:2]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        fd = os.open(_path(name), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        header = os.pread(fd, 2, 0)
        if header[1:2] != bytes([POOLED]):
            return not _alive(owner)
        if sender == os.getpid() or _alive(sender):
            return False  # its sender's pool takes care of it
        if header[:1] == bytes([FREE]):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (dropped with the fd)
            except BlockingIOError:
                return False  # a receiver still maps it: it unlinks it when done
            return True
        return not _alive(owner)
    finally:
        os.close(fd)


def leftovers(pids: Collection[int] | None = None) -> list[Leftover]:
    """The files of this pid namespace's fiber segments and shared objects that nobody
    can use any more (what :func:`sweep` removes), or only those whose names name one
    of ``pids``: message segments of ended processes (see :func:`sweep`), and the
    files and named semaphores of shared objects whose creator has ended."""
    try:
        names = os.listdir(DIRECTORY)
        pidns = str(_pidns())
    except OSError:
        return []
    found = []
    for name in names:
        if (state := _STATE_NAME.match(name)) and state.group(1) == pidns:
            named: tuple[int, ...] = (int(state.group(2)),)
            left = not _alive(named[0])
        elif (match := _NAME.match(name)) and match.group(1) == pidns:
            owner, sender = int(match.group(2)), int(match.group(3))
            named = (owner, sender)
            left = not (_alive(owner) and _alive(sender)) and _segment_left(name, owner,
                                                                            sender)
        else:
            continue
        if not left or (pids is not None and not set(named) & set(pids)):
            continue
        try:
            size = os.stat(_path(name)).st_size
        except OSError:
            continue  # removed meanwhile
        found.append(Leftover(name, size, named, name.startswith("sem.")))
    return found


def remove_leftover(left: Leftover) -> bool:
    """Unlink a file :func:`leftovers` found; whether this call removed it."""
    try:
        os.unlink(_path(left.name))
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("cannot remove %s: %s", _path(left.name), exc)
        return False
    return True


def sweep(pids: Collection[int] | None = None) -> int:
    """Remove the segments (of this pid namespace) that nobody can use any more
    (:func:`leftovers`; only those naming one of ``pids`` when given): a one-off
    message of a mailbox whose process is gone; a pooled segment of a sender that is
    gone, when it is free and unmapped or its message's mailbox is gone too; the names
    of shared objects whose creator is gone (:func:`state_name`: processes that
    attached to them keep them). Returns how many."""
    global _last_sweep
    _last_sweep = time.monotonic()
    removed = sum(remove_leftover(left) for left in leftovers(pids))
    if removed:
        logger.debug("removed %d shared-memory segments of ended processes", removed)
    return removed


def close_pool(dead_owners_only: bool = False) -> None:
    """Unlink this process's pooled segments (at exit), or those for mailboxes of
    processes that are gone. A message still in flight to a live mailbox stays: its
    receiver or mailbox unlinks it once this process is gone. (A receiver that maps a
    segment keeps its pages when the name goes.)"""
    global _pool_bytes
    with _pool_lock:
        owners = [o for o in _pools if not dead_owners_only or not _alive(o)]
        pools = {owner: _pools.pop(owner) for owner in owners}
        _pool_bytes -= sum(slot.size for pool in pools.values() for slot in pool)
    for owner, pool in pools.items():
        for slot in pool:
            if slot.map is None or slot.map[0] != IN_FLIGHT or not _alive(owner):
                unlink(slot.name)
            slot.close()


def _maybe_sweep() -> None:
    if time.monotonic() - _last_sweep > SWEEP_INTERVAL or not _last_sweep:
        close_pool(dead_owners_only=True)
        sweep()


def segments(pid: int | None = None) -> list[str]:
    """Names of the existing fiber segments of this pid namespace, or only those
    sent to or by process ``pid`` (for tests)."""
    pidns = str(_pidns())
    try:
        names = os.listdir(DIRECTORY)
    except OSError:
        return []
    found = []
    for name in names:
        match = _NAME.match(name)
        if match and match.group(1) == pidns and (
                pid is None or str(pid) in (match.group(2), match.group(3))):
            found.append(name)
    return sorted(found)


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


def _mark_used() -> None:
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
