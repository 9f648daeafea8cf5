"""fiber-docker: the ``docker`` backend of fiber.

Every fiber process is a container on a Docker engine (see :mod:`fiber_docker.backend`).
Install it next to fiber-core (``pip install fiber-core fiber-docker``) and select it with
``FIBER_BACKEND=docker``; its settings are declared in :mod:`fiber_docker.plugin`.
"""

from fiber_docker.backend import DockerBackend

__all__ = ["DockerBackend"]
__version__ = "0.1.0"
