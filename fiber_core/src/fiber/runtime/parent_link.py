"""A job's view of its parent's life: the ``sentinel`` and ``is_alive()`` of
:func:`fiber.parent_process` in a child.

A job exits as soon as its parent is gone (its connection dropped or its heartbeat
stopped: :mod:`fiber.runtime.bootstrap`), so no job outlives its run. A process that
took its parent's sentinel watches for that moment, as a child of multiprocessing
does (it waits on the sentinel, then cleans up): when the parent is gone the sentinel
becomes readable and such a process has :data:`GRACE` seconds to finish before the job
exits (status 70, :data:`fiber.runtime.bootstrap.PARENT_GONE_EXIT`: its heartbeat
thread, which found the parent gone, waits out the grace); a process that never took
the sentinel exits at once.
"""

from __future__ import annotations

import os
import threading

from fiber import util

GRACE = 10.0  # seconds a process watching its parent's sentinel has after the parent is gone

_lock = threading.Lock()
_pipe: tuple[int, int] | None = None  # (read end: the sentinel, write end)
_watched = False
_gone = False


def _ensure_pipe() -> tuple[int, int]:
    global _pipe
    if _pipe is None:
        _pipe = os.pipe()
    return _pipe


def sentinel() -> int:
    """A file descriptor that becomes readable (end of file) once the parent is gone;
    taking it asks for the grace period (see the module's docstring)."""
    global _watched
    with _lock:
        read_end, write_end = _ensure_pipe()
        _watched = True
        if _gone and write_end >= 0:
            _close_write_end()
        return read_end


def is_alive() -> bool:
    """Whether the parent is still there, as far as this job knows."""
    return not _gone


def _close_write_end() -> None:
    global _pipe
    if _pipe is not None and _pipe[1] >= 0:
        os.close(_pipe[1])
        _pipe = (_pipe[0], -1)


def gone(reason: str) -> bool:
    """The parent is gone: make the sentinel readable. Returns whether the job exits
    at once (True), or gives the process :data:`GRACE` seconds first because it
    watches the sentinel (the caller's job). Called from any thread, perhaps more than
    once."""
    global _gone
    with _lock:
        first = not _gone
        _gone = True
        if _watched:
            _close_write_end()
    if not _watched:
        return True
    if first:
        util.get_logger().info("parent process is gone (%s); this process has %.0f s "
                               "to end before its job exits", reason, GRACE)
    return False
