"""The plugin module named by fiber-slurm's entry point: registers the ``slurm``
backend and its settings (``slurm_*``, environment ``FIBER_SLURM_*``)."""

from __future__ import annotations

from fiber.backend.hookspecs import hookimpl
from fiber.backend.options import ConfigOption
from fiber_slurm.backend import SlurmBackend
from fiber_slurm.options import OPTIONS


@hookimpl
def fiber_backends() -> dict[str, type[SlurmBackend]]:
    return {"slurm": SlurmBackend}


@hookimpl
def fiber_config_options() -> list[ConfigOption]:
    return list(OPTIONS)
