"""Fixtures of the docker backend's tests: the engine started by ``--fiber-backend docker``
(tests/engines/docker.py), backends built from the effective fiber settings, a client
of the same engine for checking what the backend did, and unique run labels."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator

import docker
import pytest

from fiber.runtime import config
from fiber_docker.backend import DockerBackend


@pytest.fixture(scope="session")
def docker_engine(fiber_engine) -> dict[str, str]:
    """The settings of the running test engine; these tests need ``--fiber-backend docker``."""
    if fiber_engine["backend"] != "docker":
        pytest.skip("the docker backend's tests need `pytest --fiber-backend docker`")
    return fiber_engine


@pytest.fixture(scope="session")
def engine_client(docker_engine) -> Iterator[docker.DockerClient]:
    client = docker.DockerClient(base_url=os.environ["FIBER_DOCKER_HOST"], version="auto")
    yield client
    client.close()


@pytest.fixture
def run_labels() -> dict[str, str]:
    return {"fiber.run": "dockertest-" + uuid.uuid4().hex[:8], "fiber.parent": "dockertest"}


@pytest.fixture
def make_backend(docker_engine) -> Iterator[Callable[..., DockerBackend]]:
    """``make_backend(**settings)``: a DockerBackend with the effective settings
    (environment from the engine) overridden by ``settings``; closed afterwards."""
    made: list[DockerBackend] = []

    def make(**overrides) -> DockerBackend:
        options = config.load(overrides).as_dict()
        backend = DockerBackend(options)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend) -> DockerBackend:
    return make_backend()
