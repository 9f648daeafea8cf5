"""The backend contract: everything a backend plugin implements and may import.

A backend turns a :class:`JobSpec` into a running :class:`Job` on some cluster and
reports its :class:`JobStatus`, delivering the run's secret to the job privately
(:mod:`fiber.backend.secrets`); it subclasses :class:`Backend`, declares its settings
as :class:`ConfigOption` objects and declares both in a :class:`Plugin`, the data its
entry point names (backend names to dotted paths, settings, and the version of this
contract it implements, :data:`CONTRACT_VERSION`). Those names, the errors below,
:func:`start_thread` (:func:`fiber.threads.start`: every thread a plugin starts, its
kind declared in :data:`fiber.threads.KINDS`) and the test suite :mod:`fiber.testing`
are the whole contract: a plugin imports nothing else of fiber (the ``lint``
environment checks it).

Inside fiber, the same package holds the machinery behind the contract: the plugin
registry (:mod:`fiber.backend.registry`) and the built-in ``local`` backend
(:mod:`fiber.backend.local`), which registers the same way as any other.
"""

from __future__ import annotations

from typing import Any

from fiber.backend.base import CAPABILITIES, Backend
from fiber.backend.hookspecs import BackendFactory, hookimpl
from fiber.backend.images import BuiltImage, ImageBuilder, ImageRequest
from fiber.backend.job import Job, JobSpec, JobState, JobStatus
from fiber.backend.options import (
    ConfigOption,
    parse_bool,
    parse_list,
    parse_memory,
    parse_nonnegative_int,
    parse_positive_float,
    parse_positive_int,
)
from fiber.backend.plugin import CONTRACT_VERSION, Plugin
from fiber.backend.resources import Resources, parse_walltime
from fiber.backend.secrets import (
    SECRETS_FILE_ENV,
    SecretsFileError,
    load_secrets,
    read_secrets_file,
    secrets_file_content,
    write_secrets_file,
)
from fiber.errors import (
    BackendError,
    ClusterUnreachableError,
    ConfigError,
    FiberThreadError,
    ImageBuildError,
    JobCreationError,
    TransientBackendError,
)
from fiber.threads import start as start_thread

__all__ = [
    "CAPABILITIES", "CONTRACT_VERSION", "Backend", "BackendError", "BackendFactory", "ClusterUnreachableError", "ConfigError",
    "ConfigOption", "FiberThreadError", "BuiltImage", "ImageBuilder", "ImageBuildError",
    "ImageRequest", "Job", "Resources", "parse_walltime", "JobCreationError", "JobSpec", "JobState", "JobStatus", "Plugin",
    "SECRETS_FILE_ENV", "SecretsFileError", "TransientBackendError", "hookimpl",
    "start_thread",
    "load_secrets", "parse_bool", "parse_list", "parse_memory",
    "parse_nonnegative_int", "parse_positive_float", "parse_positive_int",
    "read_secrets_file", "secrets_file_content", "write_secrets_file",
]


def __getattr__(name: str) -> Any:
    # uber/fiber 0.2's fiber.backend.get_backend (deprecated): found by name, as it
    # uses the runtime, a layer above this contract (fiber.uber_backend)
    if name == "get_backend":
        import importlib

        return importlib.import_module("fiber.uber_backend").get_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
