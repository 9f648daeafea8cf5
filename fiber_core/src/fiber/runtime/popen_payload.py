"""How a fiber job's payload (the pickled Process) treats objects of the standard
library's multiprocessing.

While it pickles the payload, :func:`pickling` makes the job's Popen the
*spawning popen* of :mod:`multiprocessing.context`, as multiprocessing's own spawn
does: objects that may only be pickled "through inheritance" (they call
``context.assert_spawning``) then pickle as they would for a spawned child, and code
that checks the same thing works in fiber's processes. The Popen is marked
``fiber_job``, so fiber's own objects do not put the run's secret into the payload
(a job gets it in its environment; :func:`fiber.wire.auth.for_stdlib_child`).

Some standard objects cannot go to a job as they are (their state is an OS pipe of
this host): an API module registers a reducer for their class (:func:`register`;
``fiber.queues`` does for ``multiprocessing.queues.Queue``), used in place of the
object's own pickling in payloads only. A standard ``Connection`` (a descriptor)
raises at once, saying to use a fiber Pipe (:meth:`JobPopenMarker.DupFd`), and so does a
standard lock or semaphore (its named semaphore exists on this host only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from multiprocessing import context as _mp_context
from typing import Any

from fiber.errors import SerializationError

__all__ = ["JobPopenMarker", "pickling", "reducer_for", "register"]

_reducers: dict[type, Callable[[Any], Any]] = {}
_by_class: dict[type, Callable[[Any], Any] | None] = {}  # what reducer_for found


def register(cls: type, reducer: Callable[[Any], Any]) -> None:
    """Pickle instances of ``cls`` (and of its subclasses) in job payloads with
    ``reducer(obj)`` (a ``__reduce__``-style tuple)."""
    _reducers[cls] = reducer
    _by_class.clear()


def reducer_for(obj: Any) -> Callable[[Any], Any] | None:
    """The registered reducer of ``obj``'s class, if any (one dictionary lookup per
    object once its class was seen)."""
    kind = type(obj)
    try:
        return _by_class[kind]
    except KeyError:
        pass
    found = None
    for cls in kind.__mro__:
        found = _reducers.get(cls)
        if found is not None:
            break
    _by_class[kind] = found
    return found


def _refuse_semlock(obj: Any) -> Any:
    raise SerializationError(
        f"cannot send a multiprocessing {type(obj).__name__} to a fiber process (a job "
        "may run on another host, where its semaphore does not exist): use fiber's "
        "(import fiber as multiprocessing; fiber.Lock() ...)")


def _refuse_connection(obj: Any) -> Any:
    return JobPopenMarker("").DupFd(obj.fileno() if not obj.closed else -1)


def _register_refusals() -> None:
    from multiprocessing import connection, synchronize  # stdlib

    register(synchronize.SemLock, _refuse_semlock)
    register(connection._ConnectionBase, _refuse_connection)


_register_refusals()


class JobPopenMarker:
    """What ``multiprocessing.context.get_spawning_popen()`` returns while a fiber
    job's payload is pickled."""

    fiber_job = True

    def __init__(self, name: str) -> None:
        self.name = name

    def DupFd(self, fd: int) -> Any:  # noqa: N802 - multiprocessing's name
        to = f"the fiber process {self.name!r}" if self.name else "a fiber process"
        raise SerializationError(
            f"cannot send a multiprocessing object holding a file descriptor ({fd}) to "
            f"{to}: a job may run on another host. Use fiber's Pipe and Queue "
            "(import fiber as multiprocessing)")

    def duplicate_for_child(self, handle: int) -> Any:
        return self.DupFd(handle)


@contextlib.contextmanager
def pickling(name: str) -> Iterator[None]:
    """The block in which the payload of the job of process ``name`` is pickled."""
    previous = _mp_context.get_spawning_popen()
    marker: Any = JobPopenMarker(name)  # duck-typed: what pickling asks of a Popen
    _mp_context.set_spawning_popen(marker)
    try:
        yield
    finally:
        _mp_context.set_spawning_popen(previous)
