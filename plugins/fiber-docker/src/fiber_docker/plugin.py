"""Registration of the ``docker`` backend and its settings with fiber's hooks.

Settings (each also read from ``FIBER_<NAME>`` and ``.fiberconfig``):

- ``docker_host``: the engine's address (``unix:///path``, ``tcp://host:port``);
  default ``DOCKER_HOST``, else the engine's default socket.
- ``docker_network``: run jobs on this Docker network instead of the host's network.
- ``docker_mount_cwd``: bind-mount the parent's working directory into every job at
  the same path (default true).
- ``docker_volumes``: extra mounts, ``HOST:CONTAINER[:ro|rw]`` separated by commas.
- ``docker_mount_socket``: bind the engine's unix socket into every job so that jobs
  can start jobs themselves (default true).
- ``docker_pid_host``: run jobs in the host's PID namespace, so that process ids
  are unique across jobs as they are across processes (default true).
- ``docker_keep_containers``: do not remove ended containers (for debugging).
- ``docker_timeout``: seconds an engine call may take; a call that takes longer is a
  transient error, retried (whole seconds, default 60).

The core's ``image``, ``cpu``, ``memory`` and ``gpu`` settings apply too.

Every fiber process imports this module when it reads its settings (jobs of any backend
included), so it imports only fiber's contract and the light parser module
:mod:`fiber_docker.volumes`; the backend, and the Docker client library with it, is
imported by fiber's registry from the dotted path of :data:`plugin`, the first time the
``docker`` backend is used.
"""

from __future__ import annotations

from fiber.backend import (
    ConfigOption,
    Plugin,
    parse_bool,
    parse_positive_int,
)
from fiber_docker.volumes import parse_volumes

OPTIONS = [
    ConfigOption("docker_host", str, None,
                 "Docker engine address, e.g. unix:///var/run/docker.sock or tcp://host:2375 "
                 "(default: DOCKER_HOST, else the engine's default socket)"),
    ConfigOption("docker_network", str, None,
                 "Docker network of jobs (default: the host's network)"),
    ConfigOption("docker_mount_cwd", parse_bool, True,
                 "bind-mount the parent's working directory into jobs at the same path"),
    ConfigOption("docker_volumes", parse_volumes, None,
                 "extra mounts of jobs: HOST:CONTAINER[:ro|rw], comma-separated"),
    ConfigOption("docker_mount_socket", parse_bool, True,
                 "bind the engine's unix socket into jobs so they can start jobs themselves"),
    ConfigOption("docker_pid_host", parse_bool, True,
                 "run jobs in the host's PID namespace (process ids unique across jobs)"),
    ConfigOption("docker_keep_containers", parse_bool, False,
                 "keep ended job containers instead of removing them (debugging)"),
    ConfigOption("docker_timeout", parse_positive_int, 60,
                 "seconds an engine call may take before it is retried as a transient error"),
]


plugin = Plugin(
    package="fiber-docker",
    contract=1,  # the version of fiber's plugin contract this package implements
    backends={"docker": "fiber_docker.backend:DockerBackend"},
    # `fiber build` / `fiber run --build`, for the docker and kubernetes backends
    builders={"docker": "fiber_docker.builder:DockerImageBuilder"},
    options=OPTIONS,
)
