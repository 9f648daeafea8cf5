"""The plugin module named by fiber-slurm's entry point: registers the ``slurm``
backend and its settings (``slurm_*``, environment ``FIBER_SLURM_*``).

Every fiber process imports this module when it reads its settings (jobs of any backend
included), so it imports only fiber's contract and the light :mod:`fiber_slurm.options`;
the backend (its command runner, batch-script templates and state tables) is imported by
fiber's registry from the dotted path of :data:`plugin`, the first time the ``slurm``
backend is used.
"""

from __future__ import annotations

from fiber.backend import Plugin
from fiber_slurm.options import OPTIONS

plugin = Plugin(
    package="fiber-slurm",
    contract=1,  # the version of fiber's plugin contract this package implements
    backends={"slurm": "fiber_slurm.backend:SlurmBackend"},
    options=OPTIONS,
)
