"""Exceptions of fiber: multiprocessing's own, re-exported, plus fiber's."""

from __future__ import annotations

from multiprocessing import AuthenticationError, BufferTooShort, ProcessError, TimeoutError

from fiber.backend import BackendError, ClusterUnreachableError, JobCreationError
from fiber.options import ConfigError
from fiber.plugins import BackendNotFoundError

__all__ = [
    "AuthenticationError", "BackendError", "BackendNotFoundError", "BufferTooShort",
    "ClusterUnreachableError", "ConfigError", "ConnectionLostError", "JobCreationError",
    "ProcessError", "ProcessStartError", "RemoteError", "TimeoutError", "WorkerLostError",
]


class ConnectionLostError(ConnectionError):
    """The process at the other end of a fiber connection went away (it exited, its
    job was deleted, or its host became unreachable)."""


class ProcessStartError(ProcessError):
    """A job-backed process ended before it connected back to its parent: its job
    could not run fiber's bootstrap (wrong image or Python, missing package, ...).
    ``exitcode``, ``reason`` and ``logs`` say what the backend knows."""

    def __init__(self, message: str, exitcode: int | None = None, reason: str | None = None,
                 logs: str = "") -> None:
        super().__init__(message)
        self.exitcode = exitcode
        self.reason = reason
        self.logs = logs


class WorkerLostError(ProcessError):
    """A Pool task failed because every worker that ran it died (a "poison" task)."""


class RemoteError(Exception):
    """An exception raised in another process, carried with its traceback text when
    the exception itself could not be pickled."""

    def __init__(self, type_name: str, message: str, traceback_text: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.traceback_text = traceback_text

    def __str__(self) -> str:
        return f"{self.args[0]}\n\nRemote traceback:\n{self.traceback_text}"
