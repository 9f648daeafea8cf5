"""fiber-ssh: the ``ssh`` backend of fiber, which runs every job as a process on one of
a configured list of SSH hosts (see :mod:`fiber_ssh.backend`)."""

from fiber_ssh._version import __version__

__all__ = ["__version__"]
