"""The named semaphores of this process's synchronization primitives
(:mod:`fiber.synchronize`): creating one (:func:`new_semlock`: a POSIX named semaphore,
``_multiprocessing.SemLock``, the C type multiprocessing uses, named
``"/" + fiber.wire.shm.state_name()``), reopening one that a process of this host
created (:func:`reopen`), and unlinking the names this process created
(:func:`unlink_name` when a primitive is garbage collected in its creator,
:func:`unlink_all` at exit, after the children were joined:
:data:`fiber.util.SHARED_STATE`).

**No named semaphores** (``/dev/shm`` missing or read-only): :func:`new_semlock` then
makes a :class:`LocalSemLock`, the same methods over :mod:`threading` in the creator
(one warning in the log), and every other process uses the primitive through the
creator (:mod:`fiber.runtime.shared.sync_proxies`).

``_multiprocessing.SemLock`` is a private type of CPython; this module uses its
constructor ``SemLock(kind, value, maxvalue, name, unlink)``, ``SemLock._rebuild(handle,
kind, maxvalue, name)`` (reopens a name: the same on Python 3.9-3.13) and
``sem_unlink(name)``, as :mod:`multiprocessing.synchronize` does.
"""

from __future__ import annotations

import _multiprocessing  # CPython private: see above (no stubs: mypy.ini)
import errno
import logging
import os
import threading
from typing import Any

from fiber import util
from fiber.runtime.shared.created import CreatedNames
from fiber.wire import shm

__all__ = ["RECURSIVE_MUTEX", "SEMAPHORE", "SEM_VALUE_MAX", "LocalSemLock", "new_semlock",
           "reopen", "unlink_all", "unlink_name"]

# (the warning below keeps the name of the module whose objects it is about)
logger = logging.getLogger("fiber.synchronize")

RECURSIVE_MUTEX, SEMAPHORE = 0, 1  # the kinds of _multiprocessing.SemLock
SEM_VALUE_MAX = _multiprocessing.SemLock.SEM_VALUE_MAX

def _remove(name: str) -> None:
    try:
        _multiprocessing.sem_unlink(name)
    except OSError:
        pass


_names = CreatedNames(_remove)  # semaphore names created here and not unlinked yet
#: unlink a name if this process created it and has not unlinked it yet
unlink_name = _names.unlink
#: at exit, after the children were joined: unlink every name created here
unlink_all = _names.unlink_all
_warned_local = False


def new_semlock(kind: int, value: int, maxvalue: int) -> Any:
    """A new named semaphore of this process (unlinked when ``owner`` goes), or a
    :class:`LocalSemLock` if this host has no named semaphores."""
    global _warned_local
    if value < 0 or value > SEM_VALUE_MAX:
        # what multiprocessing's sem_open raises for it (not a host without named
        # semaphores: that fallback would make a semaphore of a negative value)
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    for _ in range(100):
        name = "/" + shm.state_name()
        try:
            semlock = _multiprocessing.SemLock(kind, value, maxvalue, name, False)
        except FileExistsError:
            continue
        except OSError as exc:
            if not _warned_local:
                _warned_local = True
                logger.warning(
                    "no named semaphores on this host (%s): fiber's locks and other "
                    "primitives are served by the process that creates them, to every "
                    "other process (one round trip per operation)", exc)
            return LocalSemLock(kind, value, maxvalue)
        _names.add(name)
        util.at_exit("shared semaphores", util.SHARED_STATE, unlink_all)
        return semlock
    raise FileExistsError("cannot find a free name for a semaphore")


def reopen(kind: int, maxvalue: int, name: str, what: str) -> Any:
    """The semaphore ``name`` that a process of this host created."""
    try:
        return _multiprocessing.SemLock._rebuild(0, kind, maxvalue, name)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the {what} is gone: the process that created it has exited (a shared "
            "object must be received while its creator runs)") from None


class LocalSemLock:
    """The methods of ``_multiprocessing.SemLock`` over :mod:`threading`, for a host
    without named semaphores: only its creator uses it natively."""

    name = None
    handle = 0

    def __init__(self, kind: int, value: int, maxvalue: int) -> None:
        self.kind, self.maxvalue = kind, maxvalue
        self._value = value
        self._held = 0  # acquisitions by _tid not yet released, as SemLock's count
        self._tid: int | None = None
        self._cond = threading.Condition(threading.Lock())

    def _is_mine(self) -> bool:
        return self._held > 0 and self._tid == threading.get_ident()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if self.kind == RECURSIVE_MUTEX and self._is_mine():
            self._held += 1
            return True
        with self._cond:
            if block:
                wait = None if timeout is None else max(0.0, timeout)
                if not self._cond.wait_for(lambda: self._value > 0, wait):
                    return False
            elif self._value <= 0:
                return False
            self._value -= 1
            self._held += 1
            self._tid = threading.get_ident()
            return True

    def release(self) -> None:
        if self.kind == RECURSIVE_MUTEX:
            if not self._is_mine():
                raise AssertionError("attempt to release recursive lock not owned by thread")
            if self._held > 1:
                self._held -= 1
                return
        with self._cond:
            if self.kind != RECURSIVE_MUTEX and self._value >= self.maxvalue:
                raise ValueError("semaphore or lock released too many times")
            self._value += 1
            self._held -= 1
            self._cond.notify()

    def _count(self) -> int:
        return self._held

    def _get_value(self) -> int:
        return self._value

    def _is_zero(self) -> bool:
        return self._value == 0

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
