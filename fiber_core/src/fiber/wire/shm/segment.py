"""What a shared-memory segment of fiber is: its file in :data:`DIRECTORY`, its name
(who made it, for whom: :data:`SEGMENT_NAME`, and the names of shared objects,
:data:`STATE_NAME`), its 64-byte header and the layout of its buffers; and whether the
processes a name names still run (:func:`alive`). The rest of :mod:`fiber.wire.shm`
reads :data:`DIRECTORY` from here at each call (tests point it elsewhere)."""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Sequence

logger = logging.getLogger("fiber.shm")

DIRECTORY = "/dev/shm"
THRESHOLD = 1 << 20  # out-of-band bytes of one message from which shared memory is used
ALIGN = 64  # buffers start at multiples of this in a segment
#: a message segment: fiber-<pid namespace>-<mailbox owner pid>-<sender pid>-<random>
SEGMENT_NAME = re.compile(r"fiber-(\d+)-(\d+)-(\d+)-[0-9a-f]{16}\Z")
#: shared objects (fiber.synchronize, fiber.sharedctypes, fiber.shared_memory): files
#: and named semaphores ("sem." + name) of their creator
STATE_NAME = re.compile(r"(?:sem\.)?fiber-st-(\d+)-(\d+)-[0-9a-f]{16}\Z")
HEADER = 64  # byte 0: a message is in flight; byte 1: pooled
IN_FLIGHT, FREE = 1, 0
POOLED, ONE_OFF = 1, 0

__all__ = ["DIRECTORY", "THRESHOLD", "ALIGN", "HEADER", "IN_FLIGHT", "FREE", "POOLED",
           "ONE_OFF", "SEGMENT_NAME", "STATE_NAME", "SegmentError", "pidns", "path",
           "new_name", "state_name", "state_names", "segments", "layout", "unlink",
           "alive"]


class SegmentError(OSError):
    """A shared-memory segment named in a message cannot be opened."""


def pidns() -> int:
    """This process's pid namespace (segment names carry it)."""
    return os.stat("/proc/self/ns/pid").st_ino


def path(name: str) -> str:
    """The file of segment or shared object ``name``."""
    return os.path.join(DIRECTORY, name)


def new_name(owner_pid: int) -> str:
    """A new name for a message segment this process sends to a mailbox of
    ``owner_pid``."""
    return f"fiber-{pidns()}-{owner_pid}-{os.getpid()}-{secrets.token_hex(8)}"


def state_name() -> str:
    """A new name for a shared object this process creates: a file of
    :data:`DIRECTORY`, or a named semaphore (``"/" + name``, whose file is
    ``sem.<name>``). :func:`fiber.wire.shm.sweep` removes it once this process is
    gone."""
    return f"fiber-st-{pidns()}-{os.getpid()}-{secrets.token_hex(8)}"


def _names() -> list[str]:
    try:
        return os.listdir(DIRECTORY)
    except OSError:
        return []


def state_names(pid: int | None = None) -> list[str]:
    """The files of the shared objects of this pid namespace that exist, or only those
    created by process ``pid`` (for tests)."""
    namespace = str(pidns())
    return sorted(name for name in _names()
                  if (m := STATE_NAME.match(name)) and m.group(1) == namespace
                  and (pid is None or m.group(2) == str(pid)))


def segments(pid: int | None = None) -> list[str]:
    """Names of the existing fiber segments of this pid namespace, or only those
    sent to or by process ``pid`` (for tests)."""
    namespace = str(pidns())
    return sorted(name for name in _names()
                  if (m := SEGMENT_NAME.match(name)) and m.group(1) == namespace
                  and (pid is None or str(pid) in (m.group(2), m.group(3))))


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of buffers of ``sizes`` in one segment (after its header), and its
    total size."""
    offsets, end = [], HEADER
    for size in sizes:
        end = -(-end // ALIGN) * ALIGN
        offsets.append(end)
        end += size
    return offsets, end


def unlink(name: str) -> None:
    """Remove segment ``name`` (nothing if it is gone already)."""
    if not SEGMENT_NAME.match(name):
        return
    try:
        os.unlink(path(name))
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove shared-memory segment %s: %s", name, exc)


def alive(pid: int) -> bool:
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


def sender_gone(name: str) -> bool:
    """Whether the process that sent message segment ``name`` has ended."""
    match = SEGMENT_NAME.match(name)
    return match is not None and not alive(int(match.group(3)))
