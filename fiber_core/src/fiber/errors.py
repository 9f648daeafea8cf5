"""Every exception fiber raises, in one module that imports nothing of fiber, so that
each layer (the API, the runtime, the wire, the backend contract) can raise and catch
them without importing another layer.

multiprocessing's own exceptions are re-exported: code that catches
``multiprocessing.ProcessError`` catches fiber's subclasses too.
"""

from __future__ import annotations

import pickle
from multiprocessing import AuthenticationError, BufferTooShort, ProcessError, TimeoutError
from typing import Any, TypeVar

__all__ = [
    "NotPrivateError",
    "AuthenticationError", "BackendError", "BackendNotFoundError", "BufferTooShort",
    "ClusterUnreachableError", "ConfigError", "ConnectionLostError", "FiberThreadError",
    "ForkedProcessError", "HandleError", "ImageBuildError", "JobCreationError",
    "JournalError", "ListenerLostError", "PluginContractError",
    "ProcessError", "ProcessStartError", "RemoteError", "ResultUnpicklingError",
    "SerializationError", "ShipError",
    "TimeoutError", "TransientBackendError", "WorkerLostError",
]


# -- the API and the runtime ------------------------------------------------------------
class NotPrivateError(PermissionError):
    """A directory where fiber keeps what only this user may read or write (program
    registrations holding the run's secret, records of processes to signal) exists but
    is not private to this user: another user made it, or can write or read in it.
    fiber does not use it; the message names it and says what to do."""


class ProcessStartError(ProcessError):
    """A job-backed process ended before it connected back to its parent: its job
    could not run fiber's bootstrap (wrong image or Python, missing package, another
    fiber version, ...). ``exitcode``, ``reason`` and ``logs`` say what the backend
    knows."""

    def __init__(self, message: str, exitcode: int | None = None, reason: str | None = None,
                 logs: str = "") -> None:
        super().__init__(message)
        self.exitcode = exitcode
        self.reason = reason
        self.logs = logs


class WorkerLostError(ProcessError):
    """A Pool task failed because every worker that ran it died (a "poison" task)."""


class ResultUnpicklingError(pickle.UnpicklingError):
    """A Pool task's result (or its exception) reached the parent but could not be
    unpickled there (a class missing in the parent, a ``__reduce__`` callable or a
    ``__setstate__`` that raises). The message names the task (its function, its
    arguments or its place in the map) and ``__cause__`` is what unpickling raised. The
    task ran, and is not run again; its worker goes on. multiprocessing has no such
    error: its result handler thread dies there, and the pool hangs."""


class JournalError(RuntimeError):
    """A durable pool's journal (``fiber.Pool(journal=path)``) cannot be used: its
    path cannot be written, another program holds it, its file is damaged or of
    another format, or a write failed (a full disk). The message names the file and
    says what to do; no result is ever taken from a journal that raised it."""


class FiberThreadError(RuntimeError):
    """A thread fiber started died of an uncaught exception, and the call raising this
    depended on it (a pool's supervisor, a queue's watcher, ...). The message names the
    thread and its exception; ``thread`` is the thread's name and ``__cause__`` the
    exception (in the process where the thread ran: a pickled copy keeps the message
    and ``thread`` only). Started through :mod:`fiber.threads`."""

    def __init__(self, message: str, thread: str = "") -> None:
        super().__init__(message)
        self.thread = thread

    def __reduce__(self) -> tuple[type[FiberThreadError], tuple[str, str]]:
        return type(self), (str(self.args[0]) if self.args else "", self.thread)


# -- the wire -----------------------------------------------------------------------------
class ForkedProcessError(ProcessError, RuntimeError):
    """A process forked from a fiber process (``os.fork``, multiprocessing's ``fork``
    start method) asked for what fiber's wire cannot give after a fork (a hub of its
    own, a connection to a process other than its parent): the message says to start
    it with spawn or forkserver."""


class HandleError(OSError):
    """A connection, socket or file descriptor sent to another process could not be
    duplicated into it: the two do not share a kernel and network namespace (another
    host, a container or pod with its own network), its sender has exited, or another
    process received it already (a handle pickled once is received once). The message
    says which, and what to send instead."""


class ListenerLostError(ConnectionError):
    """A listening socket of fiber's (a hub's stream listener, a manager's or a shared
    object server's, a :class:`fiber.connection.Listener`) lost its descriptor: closed
    by something else in this process (code that closed a descriptor number it did not
    own), and no new socket could listen on its address. What depends on the listener
    (starting a job, connecting to the server) raises this, naming the listener."""


class ConnectionLostError(ConnectionError):
    """The process at the other end of a fiber connection went away (it exited, its
    job was deleted, or its host became unreachable)."""


class SerializationError(pickle.PicklingError, TypeError):
    """An object cannot be sent to another process.

    A :class:`pickle.PicklingError` and a :class:`TypeError`: multiprocessing raises
    ``TypeError`` for the same objects (``cannot pickle '_thread.lock' object``), so
    ``except TypeError`` means what it means there."""


class RemoteError(Exception):
    """An exception raised in another process, carried with its traceback text when
    the exception itself could not be pickled."""

    def __init__(self, type_name: str, message: str, traceback_text: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.args[0]}\n\nRemote traceback:\n{self.traceback_text}"


# -- the backend contract -------------------------------------------------------------------
class ConfigError(ValueError):
    """A setting is unknown or its value cannot be parsed."""


class ShipError(ConfigError):
    """What the ``ship`` setting asks to send to jobs cannot be sent: a path that does
    not exist, a file that cannot be read, a package not installed here, more than
    ``ship_limit`` (the message names the largest files). Raised by the start of the
    first job that would get it, before any job exists."""


class BackendError(RuntimeError):
    """Base class of every error a backend raises on purpose. ``transient`` says
    whether asking again may succeed (the core then retries, see
    :class:`TransientBackendError`); each class has its default, and a backend may
    override it per error: ``ClusterUnreachableError(message, transient=False)`` for a
    cluster that cannot be reached because of a setting (a missing key file or
    kubeconfig), which no retry can mend. ``retry_after`` (seconds) is the cluster's
    own word on when to ask again (an HTTP ``Retry-After``): the core waits at least
    that long before the next try."""

    transient = False
    retry_after: float | None = None

    def __init__(self, *args: object, transient: bool | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(*args)
        if transient is not None:
            self.transient = transient
        if retry_after is not None:
            self.retry_after = retry_after


class JobCreationError(BackendError):
    """The cluster refused or failed to create a job, and trying again would not help
    (a bad request, a missing image, no permission): the core fails at once. The
    message says why and what to do (for example the scheduler's own error text)."""


class ImageBuildError(BackendError):
    """A container image for a program could not be made: its directory does not
    exist, its Dockerfile failed to build (the message ends with the tail of the build
    log), or the registry refused the push (its own message). Nothing is run."""


class TransientBackendError(BackendError):
    """The cluster failed for now but may work if asked again (an API server's 500 or
    429, a scheduler's time-out, a daemon that restarts, a dropped connection): the
    core retries the call with backoff for up to ``backend_retry_timeout`` seconds
    before it gives up with this error."""

    transient = True


class ClusterUnreachableError(TransientBackendError):
    """The cluster manager cannot be reached (no engine, no API server, no host).
    Transient: the core retries as for :class:`TransientBackendError`."""


class BackendNotFoundError(LookupError):
    """The selected backend is not provided by any installed plugin."""


class PluginContractError(BackendNotFoundError):
    """The selected backend is installed but cannot be used: its plugin could not be
    loaded or declared (an entry point that does not resolve, an import error, a
    contract version, ``fiber.backend.CONTRACT_VERSION``, other than this fiber-core
    speaks, an invalid declaration), its class path does not resolve, or its class
    does not implement the contract. The message names the plugin's distribution, its
    entry point or dotted path, and the fault."""


# -- each error's entry in the troubleshooting page -----------------------------------------
# docs/troubleshooting.md (troubleshooting.html in the built site) has an entry for every
# error class, whose id is the class name in lower case. A documented class's exception
# carries a note naming its entry (so do its subclasses', with their nearest entry), which
# Python (3.11+) prints under the message; str(exc), and so every message fiber logs or
# tests read, is unchanged. tests/core/test_troubleshooting.py checks every entry named.
TROUBLESHOOTING = "docs/troubleshooting.md"

_E = TypeVar("_E", bound=type[BaseException])


def troubleshooting_note(error: BaseException) -> str:
    """The note naming ``error``'s entry of the troubleshooting page."""
    return f"troubleshooting: {TROUBLESHOOTING}#{getattr(error, 'troubleshooting', '')}"


def documented(cls: _E) -> _E:
    """Give the error class ``cls`` its entry of the troubleshooting page: each of its
    exceptions gets the note ``troubleshooting: docs/troubleshooting.md#<class name,
    lower case>`` (once, also when a documented subclass calls its ``__init__``)."""
    cls.troubleshooting = cls.__name__.lower()  # type: ignore[attr-defined]
    init = cls.__init__

    def __init__(self: BaseException, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        note = troubleshooting_note(self)
        if note not in getattr(self, "__notes__", ()) and hasattr(self, "add_note"):
            self.add_note(note)  # Python 3.11+ (3.10 prints no notes)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


for _error in (NotPrivateError, ProcessStartError, WorkerLostError, ResultUnpicklingError,
               FiberThreadError, ForkedProcessError, ConnectionLostError, SerializationError,
               RemoteError, ConfigError, BackendError, JobCreationError, TransientBackendError,
               ClusterUnreachableError, BackendNotFoundError, PluginContractError,
               JournalError, HandleError, ListenerLostError, ImageBuildError):
    documented(_error)
