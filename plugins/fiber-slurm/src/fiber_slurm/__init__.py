"""fiber-slurm: the ``slurm`` backend of fiber (every job is a Slurm batch job).

Every fiber process loads the plugin's entry point (:mod:`fiber_slurm.plugin`), and so
this package: it imports nothing. ``fiber_slurm.SlurmBackend`` is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fiber_slurm._version import __version__

__all__ = ["SlurmBackend", "__version__"]

if TYPE_CHECKING:
    from fiber_slurm.backend import SlurmBackend


def __getattr__(name: str) -> Any:
    if name == "SlurmBackend":
        # lazy for start-up time: the backend's modules only where it is used
        from fiber_slurm.backend import SlurmBackend

        return SlurmBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
