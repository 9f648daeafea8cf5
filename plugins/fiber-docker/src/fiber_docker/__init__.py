"""fiber-docker: the ``docker`` backend of fiber.

Every fiber process is a container on a Docker engine (see :mod:`fiber_docker.backend`).
Install it next to fiber-core (from a clone of fiber's repository:
``pip install ./fiber_core ./plugins/fiber-docker``) and select it with
``FIBER_BACKEND=docker``; its settings are declared in :mod:`fiber_docker.plugin`.

Every fiber process loads the plugin's entry point (:mod:`fiber_docker.plugin`), and so
this package: it imports nothing. ``fiber_docker.DockerBackend``, and with it the Docker
client library, is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fiber_docker._version import __version__

__all__ = ["DockerBackend", "__version__"]

if TYPE_CHECKING:
    from fiber_docker.backend import DockerBackend


def __getattr__(name: str) -> Any:
    if name == "DockerBackend":
        # lazy for start-up time: the docker client is loaded only by whoever uses it
        from fiber_docker.backend import DockerBackend

        return DockerBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
