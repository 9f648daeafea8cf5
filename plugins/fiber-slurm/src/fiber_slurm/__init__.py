"""fiber-slurm: the ``slurm`` backend of fiber (every job is a Slurm batch job).

Every fiber process loads the plugin's entry point (:mod:`fiber_slurm.plugin`), and so
this package: it imports nothing. The backend is
:class:`fiber_slurm.backend.SlurmBackend`, which fiber's registry imports the first time
the backend is used.
"""

from fiber_slurm._version import __version__

__all__ = ["__version__"]
