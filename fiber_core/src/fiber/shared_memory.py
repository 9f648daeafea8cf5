"""Named blocks of shared memory for the processes of one host, as
:mod:`multiprocessing.shared_memory`: :class:`SharedMemory` and :class:`ShareableList`,
and the :class:`SharedMemoryManager` that :mod:`fiber.managers` exports.

``SharedMemory(name=None, create=False, size=0)`` creates (``create=True``) or attaches
to a file of ``/dev/shm``: ``buf`` (a memoryview), ``name``, ``size``, ``close()``,
``unlink()``, with the standard library's arguments, errors and reprs. A block created
without a name gets one that :func:`fiber.wire.shm.state_name` makes, so what a killed
creator leaves is swept by the next fiber program of the host.

Lifetime, without the standard library's resource tracker process: the process that
created a block unlinks it at its exit (after its children were joined,
:data:`fiber.util.SHARED_STATE`) if nobody called ``unlink()``, and logs a warning
naming it, as multiprocessing's tracker warns of "leaked shared_memory objects" when it
cleans up at the end of the program. The difference: multiprocessing's tracker serves
the whole program, so a block a child created outlives that child until the program
ends; here it goes with the process that created it (that process is the only one of
the run sure to be on the block's host). Create a block that must outlive a child in
the parent, or use a :class:`SharedMemoryManager`.

A block is for the processes of one host: a :class:`SharedMemory` or a
:class:`ShareableList` pickles by name with its creator's host
(:func:`fiber.wire.shm.host_token`), and unpickling it in a process of another host
(or with the ``shared_memory`` setting off, ``FIBER_SHARED_MEMORY=false``) raises
:class:`FileNotFoundError` saying so; use a Queue, a Pipe or a Manager there.

:class:`ShareableList` is the standard library's list format and code, run over this
module's :class:`SharedMemory` (its constructor's code is the standard library's,
bound to this module's names), so a fiber process and a multiprocessing one can share
a list by name.

:class:`SharedMemoryManager` has the standard library's API (``start()``,
``shutdown()``, ``with``, ``SharedMemory(size)``, ``ShareableList(sequence)``; every
block it made is unlinked at shutdown, and at exit if it was not shut down) but no
server process: blocks belong to one host, so the manager keeps their names in the
process that uses it. ``start(initializer, initargs)`` calls the initializer in this
process; ``address`` is None and there is nothing to ``connect()`` to.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import types
from collections.abc import Callable, Iterable
from multiprocessing import shared_memory as _std
from typing import Any

from fiber import util
from fiber.errors import ProcessError
from fiber.runtime.shared.created import CreatedNames
from fiber.wire import shm

__all__ = ["SharedMemory", "ShareableList", "SharedMemoryManager"]

logger = logging.getLogger("fiber.shared_memory")

_created = CreatedNames()  # names this process created and has not unlinked


def _forget(name: str) -> bool:
    return _created.take(name)


def _unlink_left() -> None:
    """At exit, after the children were joined: unlink the blocks this process
    created and nobody unlinked."""
    for name in _created.take_all():
        try:
            os.unlink(_path(name))
        except FileNotFoundError:
            continue
        logger.warning("shared memory %r was not unlinked: unlinked at the exit of the "
                       "process that created it (call unlink() when no process needs it)",
                       name)


def _path(name: str) -> str:
    name = name.lstrip("/")
    if not name or "/" in name:
        raise ValueError(f"invalid shared memory name {name!r}")
    return os.path.join(shm.DIRECTORY, name)


class SharedMemory:
    """A block of shared memory of this host, created or attached by name."""

    _fd = -1
    _mmap: mmap.mmap | None = None
    _buf: memoryview | None = None

    def __init__(self, name: str | None = None, create: bool = False, size: int = 0) -> None:
        if not size >= 0:
            raise ValueError("'size' must be a positive integer")
        if create and size == 0:
            raise ValueError("'size' must be a positive number different from zero")
        if name is None and not create:
            raise ValueError("'name' can only be None if create=True")
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
        while True:
            chosen = shm.state_name() if name is None else name
            try:
                self._fd = os.open(_path(chosen), flags, 0o600)
            except FileExistsError:
                if name is None:
                    continue
                raise
            break
        self._name = chosen
        try:
            if create:
                _created.add(chosen)
                util.at_exit("shared_memory blocks", util.SHARED_STATE, _unlink_left)
                os.ftruncate(self._fd, size)
            else:
                size = os.fstat(self._fd).st_size
            self._mmap = mmap.mmap(self._fd, size)
        except BaseException:
            if create:
                self.unlink()
            self.close()
            raise
        self._size = size
        self._buf = memoryview(self._mmap)

    @property
    def buf(self) -> memoryview:
        """The block's bytes."""
        assert self._buf is not None, "closed"
        return self._buf

    @property
    def name(self) -> str:
        """The name to attach to the block with."""
        return self._name

    @property
    def size(self) -> int:
        """The block's size in bytes."""
        return self._size

    def close(self) -> None:
        """Release this process's view of the block (the block stays)."""
        if self._buf is not None:
            self._buf.release()
            self._buf = None
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        """Remove the block's name (the memory goes once every process closed it);
        call it once, in one process."""
        _forget(self._name)
        os.unlink(_path(self._name))

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, size={self.size})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild_shared_memory, (type(self), self.name, self.size, shm.host_token())


def _check_host(name: str, host: bytes | None) -> None:
    if host is None or host != shm.host_token():
        raise FileNotFoundError(
            errno.ENOENT,
            f"the shared memory {name!r} is in the memory of another host (or shared "
            "memory is turned off: FIBER_SHARED_MEMORY=false): fiber.shared_memory is "
            "for processes of one host; send the data through a fiber Queue or Pipe, "
            "or keep it in a Manager, to reach processes of other hosts", name)


def _rebuild_shared_memory(cls: type, name: str, size: int, host: bytes | None) -> Any:
    _check_host(name, host)
    return cls(name, False, size)


# the standard library's constructor, bound to this module's SharedMemory
_std_init = _std.ShareableList.__init__
if _std_init.__code__.co_freevars:  # pragma: no cover - a CPython change: see docstring
    raise ImportError("multiprocessing.shared_memory.ShareableList.__init__ changed: "
                      "fiber.shared_memory must be updated")
_init_globals = dict(vars(_std))
_init_globals["SharedMemory"] = SharedMemory
_fiber_init = types.FunctionType(_std_init.__code__, _init_globals, "__init__",
                                 _std_init.__defaults__, _std_init.__closure__)
_fiber_init.__kwdefaults__ = _std_init.__kwdefaults__
_fiber_init.__qualname__ = "ShareableList.__init__"


class ShareableList(_std.ShareableList):
    """A list of fixed length in a block of shared memory (ints, floats, bools, str,
    bytes, None), as the standard library's, over :class:`SharedMemory`."""

    __init__ = _fiber_init

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _rebuild_list, (type(self), self.shm.name, shm.host_token())


def _rebuild_list(cls: type, name: str, host: bytes | None) -> Any:
    _check_host(name, host)
    return cls(name=name)


def _unlink_names(names: list[str]) -> None:
    for name in names:
        _forget(name)
        try:
            os.unlink(_path(name))
        except FileNotFoundError:
            pass
    names.clear()


class SharedMemoryManager:
    """Makes :class:`SharedMemory` blocks and :class:`ShareableList` lists and unlinks
    them all at :meth:`shutdown` (as :class:`multiprocessing.managers.SharedMemoryManager`,
    without a server process: see the module's docstring)."""

    def __init__(self, address: Any = None, authkey: bytes | None = None,
                 serializer: str = "pickle", ctx: Any = None, *,
                 shutdown_timeout: float = 1.0) -> None:
        self._names: list[str] = []
        self._state = "initial"
        self._finalizer: util.Finalize | None = None

    @property
    def address(self) -> None:
        """None: there is no server."""
        return None

    def start(self, initializer: Callable[..., object] | None = None,
              initargs: Iterable[Any] = ()) -> None:
        """Start tracking blocks (``initializer(*initargs)`` runs in this process)."""
        if self._state == "started":
            raise ProcessError("Already started server")
        if self._state == "shutdown":
            raise ProcessError("Manager has shut down")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if initializer is not None:
            initializer(*initargs)
        self._state = "started"
        # as a manager's shutdown: a finalizer, also run at exit
        self._finalizer = util.Finalize(self, _unlink_names, args=(self._names,),
                                        exitpriority=0)

    def shutdown(self) -> None:
        """Unlink every block this manager made."""
        if self._finalizer is not None:
            self._finalizer()
        if self._state == "started":
            self._state = "shutdown"

    def __enter__(self) -> SharedMemoryManager:
        if self._state == "initial":
            self.start()
        if self._state != "started":
            raise ProcessError("Unable to start server")
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check(self) -> None:
        if self._state != "started":
            raise ProcessError("SharedMemoryManager is not started: call start() or use "
                               "it in a with statement")

    def SharedMemory(self, size: int) -> SharedMemory:  # noqa: N802 - the standard name
        """A new block of ``size`` bytes, unlinked at :meth:`shutdown`."""
        self._check()
        block = SharedMemory(None, create=True, size=size)
        self._names.append(block.name)
        return block

    def ShareableList(self, sequence: Iterable[Any] | None) -> ShareableList:  # noqa: N802
        """A new :class:`ShareableList` of ``sequence``, unlinked at :meth:`shutdown`."""
        self._check()
        made = ShareableList(sequence)
        self._names.append(made.shm.name)
        return made
