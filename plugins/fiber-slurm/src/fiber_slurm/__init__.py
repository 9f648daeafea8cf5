"""fiber-slurm: the ``slurm`` backend of fiber (every job is a Slurm batch job)."""

from fiber_slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]
