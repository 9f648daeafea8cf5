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

The package's modules, one job each (every name is imported from here):
:mod:`~fiber.wire.shm.segment` (names, header, layout), :mod:`~fiber.wire.shm.host`
(the host token, the setting), :mod:`~fiber.wire.shm.pool` (the sender's segments and
this process's cleanup), :mod:`~fiber.wire.shm.receiver` (attach, drop) and
:mod:`~fiber.wire.shm.sweep` (leftovers of killed processes).
"""


from __future__ import annotations

from fiber.wire.shm.host import enable, host_token, set_host_token
from fiber.wire.shm.pool import (
    POOL_MAX_BYTES,
    POOL_MAX_SEGMENT,
    POOL_SLOTS,
    SWEEP_INTERVAL,
    close_pool,
    used,
    write,
)
from fiber.wire.shm.receiver import attach, drop
from fiber.wire.shm.segment import (
    ALIGN,
    DIRECTORY,
    FREE,
    HEADER,
    IN_FLIGHT,
    ONE_OFF,
    POOLED,
    THRESHOLD,
    SegmentError,
    alive,
    layout,
    pidns,
    segments,
    state_name,
    state_names,
    unlink,
)
from fiber.wire.shm.sweep import Leftover, leftovers, remove_leftover, sweep

__all__ = [
    "DIRECTORY", "THRESHOLD", "ALIGN", "HEADER", "IN_FLIGHT", "FREE", "POOLED", "ONE_OFF",
    "POOL_SLOTS", "POOL_MAX_SEGMENT", "POOL_MAX_BYTES", "SWEEP_INTERVAL", "SegmentError",
    "host_token", "enable", "set_host_token", "layout", "state_name", "state_names",
    "segments", "pidns", "alive", "write", "attach", "drop", "unlink", "Leftover",
    "leftovers", "remove_leftover", "sweep", "close_pool", "used",
]
