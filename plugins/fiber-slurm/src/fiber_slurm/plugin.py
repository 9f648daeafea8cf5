"""The plugin module named by fiber-slurm's entry point: registers the ``slurm``
backend and its settings (``slurm_*``, environment ``FIBER_SLURM_*``).

Every fiber process imports this module when it reads its settings (jobs of any backend
included), so it imports only fiber's contract and the light :mod:`fiber_slurm.options`;
the backend (its command runner, batch-script templates and state tables) is imported by
the factory, the first time the ``slurm`` backend is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fiber.backend import Backend, BackendFactory, ConfigOption, hookimpl
from fiber_slurm.options import OPTIONS


def create_backend(options: Mapping[str, Any]) -> Backend:
    """The factory of the ``slurm`` backend: a :class:`~fiber_slurm.backend.SlurmBackend`."""
    # lazy for start-up time: the backend's modules only where it is used
    from fiber_slurm.backend import SlurmBackend

    return SlurmBackend(options)


@hookimpl
def fiber_backends() -> dict[str, BackendFactory]:
    return {"slurm": create_backend}


@hookimpl
def fiber_config_options() -> list[ConfigOption]:
    return list(OPTIONS)
