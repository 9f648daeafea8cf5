"""``fiber.dummy``: :mod:`multiprocessing.dummy` as it is, so that
``import fiber as multiprocessing`` keeps ``multiprocessing.dummy`` working.

multiprocessing.dummy gives the multiprocessing API over threads of this process
(``Pool`` is a ``ThreadPool``, ``Process`` a thread); nothing in it is a job, so fiber
re-exports the standard library's module unchanged.
"""

from __future__ import annotations

from multiprocessing.dummy import (
    Array,
    Barrier,
    BoundedSemaphore,
    Condition,
    DummyProcess,
    Event,
    JoinableQueue,
    Lock,
    Manager,
    Namespace,
    Pipe,
    Pool,
    Process,
    Queue,
    RLock,
    Semaphore,
    Value,
    active_children,
    current_process,
    freeze_support,
    shutdown,
)

__all__ = [
    "Process", "current_process", "active_children", "freeze_support", "Lock", "RLock",
    "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier", "Queue", "Manager",
    "Pipe", "Pool", "JoinableQueue",
    # also defined by multiprocessing.dummy, outside its __all__
    "DummyProcess", "Namespace", "Value", "Array", "shutdown",
]
