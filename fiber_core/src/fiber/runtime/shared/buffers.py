"""Blocks of shared memory that a process creates and the processes of its host attach.

A :class:`SharedBuffer` is a file of ``/dev/shm`` named by :func:`fiber.wire.shm.state_name`
(so the run's sweep removes it once its creator is gone, whoever was killed), mapped
by its creator and by every process of the same host that attaches to it by name. The
creator unlinks the name when the buffer is garbage collected in it, or at its exit
(after its children were joined, :data:`fiber.util.SHARED_STATE`); processes that
attached keep their mapping. Attaching after the name is gone raises
:class:`FileNotFoundError` with a message that says the creator is gone. Whoever
builds objects over :attr:`SharedBuffer.map` must keep the buffer referenced from
them (its collection in the creator unlinks the name).
"""

from __future__ import annotations

import mmap
import os
import weakref

from fiber import util
from fiber.runtime.shared.created import CreatedNames
from fiber.wire import shm

__all__ = ["SharedBuffer", "unlink_all"]

def _remove(name: str) -> None:
    try:
        os.unlink(os.path.join(shm.DIRECTORY, name))
    except FileNotFoundError:
        pass


_created = CreatedNames(_remove)  # names this process created and has not unlinked
_unlink = _created.unlink
#: at exit: unlink every name this process created
unlink_all = _created.unlink_all


class SharedBuffer:
    """``size`` bytes of shared memory: ``SharedBuffer(size)`` creates one (zeroed),
    :meth:`attach` maps an existing one by name. :attr:`map` is the mapping."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("a shared buffer's size must not be negative")
        name = shm.state_name()
        path = os.path.join(shm.DIRECTORY, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _created.add(name)
            util.at_exit("shared state names", util.SHARED_STATE, unlink_all)
            os.ftruncate(fd, max(size, 1))
            self.map = mmap.mmap(fd, max(size, 1))
        except BaseException:
            os.close(fd)
            _unlink(name)
            raise
        os.close(fd)
        self.name, self.size, self.created = name, size, True
        # at exit, unlink_all() does it after the children were joined (weakref's own
        # exit hook could run before fiber's exit path)
        weakref.finalize(self, _unlink, name).atexit = False

    @classmethod
    def attach(cls, name: str, size: int) -> SharedBuffer:
        """Map the buffer ``name`` that a process of this host created."""
        path = os.path.join(shm.DIRECTORY, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the shared memory {name} is gone: the process that created it has "
                "exited (a shared object must be used while its creator runs)") from None
        try:
            mapping = mmap.mmap(fd, max(size, 1))
        finally:
            os.close(fd)
        self = cls.__new__(cls)
        self.map, self.name, self.size, self.created = mapping, name, size, False
        return self

    def __repr__(self) -> str:
        return f"<SharedBuffer {self.name} size={self.size}>"
