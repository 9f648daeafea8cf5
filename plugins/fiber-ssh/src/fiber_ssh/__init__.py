"""fiber-ssh: the ``ssh`` backend of fiber, which runs every job as a process on one of
a configured list of SSH hosts (see :mod:`fiber_ssh.backend`)."""

__version__ = "0.1.0"
