"""fiber-docker: the ``docker`` backend of fiber.

Every fiber process is a container on a Docker engine (see :mod:`fiber_docker.backend`).
Install it next to fiber-core (from a clone of fiber's repository:
``pip install ./fiber_core ./plugins/fiber-docker``) and select it with
``FIBER_BACKEND=docker``; its settings are declared in :mod:`fiber_docker.plugin`.

Every fiber process loads the plugin's entry point (:mod:`fiber_docker.plugin`), and so
this package: it imports nothing. The backend is
:class:`fiber_docker.backend.DockerBackend`, which fiber's registry imports (and the
Docker client library with it) the first time the backend is used.
"""

from fiber_docker._version import __version__

__all__ = ["__version__"]
