"""multiprocessing's module-level functions that need no context: ``cpu_count``,
``freeze_support``, ``set_executable``, ``set_forkserver_preload``,
``allow_connection_pickling``, and fiber's ``get_config_value``. Every context has them
as static methods (:class:`fiber.context.BaseContext`), as multiprocessing's do."""

from __future__ import annotations

import os
from typing import Any

from fiber.runtime import config

__all__ = ["get_config_value", "cpu_count", "freeze_support", "set_executable",
           "set_forkserver_preload", "allow_connection_pickling"]


def get_config_value(name: str) -> Any:
    """fiber extension: the effective value of a setting (``fiber config`` shows all)."""
    return getattr(config.get_config(), name)


def cpu_count() -> int:
    """The number of CPUs of this machine (as multiprocessing.cpu_count())."""
    count = os.cpu_count()
    if count is None:
        raise NotImplementedError("cannot determine number of cpus")
    return count


def freeze_support() -> None:
    """Accepted for compatibility (does nothing: jobs never run a frozen executable)."""


def set_executable(executable: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> None:
    """Set the Python executable of jobs (the ``python`` setting). As in
    multiprocessing, a str, bytes or path object."""
    config.init(python=os.fsdecode(executable))


def set_forkserver_preload(module_names: list[str]) -> None:
    """Accepted for compatibility (does nothing: the local backend's template already
    imports the modules the parent has imported)."""


def allow_connection_pickling() -> None:
    """Accepted for compatibility: fiber connections are always picklable."""
