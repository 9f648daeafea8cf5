"""Whether this process may use shared memory with another, and with which: the host
token (same boot, same ``/dev/shm`` file system, same pid namespace) that a message or
a shared object carries, and the ``shared_memory`` setting that turns the path off
(:func:`enable`); :func:`set_host_token` makes a process "another host" for tests."""

from __future__ import annotations

import os
import threading

from fiber.wire.shm import segment

__all__ = ["host_token", "enable", "set_host_token"]

_lock = threading.Lock()
_token: bytes | None = None
_token_known = False
_disabled = False  # the shared_memory setting is off


def _compute_token() -> bytes | None:
    if _disabled:
        return None
    if os.environ.get("_FIBER_SHM", "1").strip().lower() in ("0", "off", "no", "false"):
        return None
    directory = segment.DIRECTORY
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        shm = os.stat(directory)
        pidns = segment.pidns()
        if not os.access(directory, os.W_OK | os.X_OK):
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
