"""What a context makes: multiprocessing's factories (``Process`` aside: the context
classes own it), each passing its context (``ctx=``; ``context=`` for ``Pool``) to the
object it makes, plus fiber's ``Ring``. :class:`Factories` is the part of
:class:`fiber.context.BaseContext` that only delegates; the context classes, and which
context a name selects, are :mod:`fiber.context.contexts`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Factories"]


class Factories:
    """multiprocessing's factories of a context; ``get_context()`` (the context the
    made objects belong to) comes from the class this is mixed into."""

    if TYPE_CHECKING:  # BaseContext's
        def get_context(self, method: str | None = None, **overrides: Any) -> Any: ...

    def current_process(self) -> Any:
        from fiber.process import current_process

        return current_process()

    def parent_process(self) -> Any:
        from fiber.process import parent_process

        return parent_process()

    def active_children(self) -> list[Any]:
        from fiber.process import active_children

        return active_children()

    def Manager(self) -> Any:  # noqa: N802 - multiprocessing's name
        """A started SyncManager whose server is a job of this context."""
        from fiber.managers import Manager

        return Manager(ctx=self.get_context())

    def Pipe(self, duplex: bool = True) -> tuple[Any, Any]:  # noqa: N802
        """Two connected ends, served for this context's jobs."""
        from fiber.connection import Pipe

        return Pipe(duplex, ctx=self.get_context())

    def Lock(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Lock

        return Lock(ctx=self.get_context())

    def RLock(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import RLock

        return RLock(ctx=self.get_context())

    def Condition(self, lock: Any = None) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Condition

        return Condition(lock, ctx=self.get_context())

    def Semaphore(self, value: int = 1) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Semaphore

        return Semaphore(value, ctx=self.get_context())

    def BoundedSemaphore(self, value: int = 1) -> Any:  # noqa: N802
        from fiber.synchronize import BoundedSemaphore

        return BoundedSemaphore(value, ctx=self.get_context())

    def Event(self) -> Any:  # noqa: N802 - multiprocessing's name
        from fiber.synchronize import Event

        return Event(ctx=self.get_context())

    def Barrier(self, parties: int, action: Any = None,  # noqa: N802
                timeout: float | None = None) -> Any:
        from fiber.synchronize import Barrier

        return Barrier(parties, action, timeout, ctx=self.get_context())

    def Queue(self, maxsize: int = 0) -> Any:  # noqa: N802 - multiprocessing's name
        """A queue served for this context's jobs."""
        from fiber.queues import Queue

        return Queue(maxsize, ctx=self.get_context())

    def JoinableQueue(self, maxsize: int = 0) -> Any:  # noqa: N802
        """A joinable queue served for this context's jobs."""
        from fiber.queues import JoinableQueue

        return JoinableQueue(maxsize, ctx=self.get_context())

    def SimpleQueue(self) -> Any:  # noqa: N802 - multiprocessing's name
        """A simple queue served for this context's jobs."""
        from fiber.queues import SimpleQueue

        return SimpleQueue(ctx=self.get_context())

    def Pool(self, processes: int | None = None, initializer: Any = None,  # noqa: N802
             initargs: Any = (), maxtasksperchild: int | None = None,
             context: Any = None, **extensions: Any) -> Any:
        """A Pool whose workers are this context's processes (fiber extensions:
        ``context``, another context's instead, as :class:`fiber.pool.Pool` takes it;
        ``extensions``, its keyword-only arguments)."""
        from fiber.pool import Pool

        return Pool(processes, initializer, initargs, maxtasksperchild,
                    self.get_context() if context is None else context, **extensions)

    def RawValue(self, typecode_or_type: Any, *args: Any) -> Any:  # noqa: N802
        from fiber.sharedctypes import RawValue

        return RawValue(typecode_or_type, *args)

    def RawArray(self, typecode_or_type: Any, size_or_initializer: Any) -> Any:  # noqa: N802
        from fiber.sharedctypes import RawArray

        return RawArray(typecode_or_type, size_or_initializer)

    def Value(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> Any:  # noqa: N802
        from fiber.sharedctypes import Value

        return Value(typecode_or_type, *args, lock=lock, ctx=self.get_context())

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, *,  # noqa: N802
              lock: Any = True) -> Any:
        from fiber.sharedctypes import Array

        return Array(typecode_or_type, size_or_initializer, lock=lock,
                     ctx=self.get_context())

    def Ring(self, processes: int, func: Any, initializer: Any = None,  # noqa: N802
             initargs: Any = ()) -> Any:
        """fiber extension: a :class:`fiber.ring.Ring` whose members are this
        context's processes."""
        from fiber.ring import Ring

        return Ring(processes, func, initializer, initargs, ctx=self.get_context())

    @property
    def reducer(self) -> Any:
        """The reduction module (:mod:`fiber.reduction`), as ``ctx.reducer``."""
        import fiber.reduction  # lazy: only code that asks for it pays for it

        return fiber.reduction

    def get_logger(self) -> Any:
        from fiber import util

        return util.get_logger()

    def log_to_stderr(self, level: int | str | None = None) -> Any:
        from fiber import util

        return util.log_to_stderr(level)
