"""The ``docker`` image builder: a program's image built on a Docker engine and pushed.

:class:`DockerImageBuilder` implements :class:`fiber.backend.ImageBuilder` for
``fiber build`` and ``fiber run --build``, for every backend whose jobs run in images
(docker, kubernetes). It uses the engine of the ``docker_host`` setting (else
``DOCKER_HOST``, else the default socket), as the docker backend does:

1. the context (:mod:`fiber_docker.context`): the program's Dockerfile and directory,
   or a generated Dockerfile with the launching environment's packages and the
   program; its hash is the tag: ``<registry>/<directory name>:<hash>`` (without a
   registry, ``fiber-<directory name>:<hash>``, kept on the engine);
2. a tag the registry (or, without one, the engine) already has is used as it is:
   nothing is built or pushed;
3. otherwise the engine builds it (host network for ``RUN`` steps; the engine's layer
   cache reuses unchanged layers) and pushes it, the registry keeping the layers it
   has (``Layer already exists``).

Failures are :class:`fiber.backend.ImageBuildError`: a build that fails ends with the
last lines of its log, a refused push with the registry's message.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import docker
import requests
from docker import errors as docker_errors

from fiber.backend import BuiltImage, ImageBuilder, ImageBuildError, ImageRequest
from fiber_docker import context as contexts
from fiber_docker import environment
from fiber_docker.engine_errors import classify

logger = logging.getLogger("fiber.docker")

DEFAULT_ENGINE = "unix:///var/run/docker.sock"
#: seconds a build or push may go without a word from the engine
STREAM_TIMEOUT = 3600
#: lines of the build log an error shows
TAIL_LINES = 25


def repository_name(directory: str, registry: str | None) -> str:
    """The image's repository: the directory's name, lower case, made valid, under the
    registry (``fiber-<name>`` without one)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", os.path.basename(directory.rstrip("/")).lower())
    name = name.strip("-._") or "program"
    if registry:
        return f"{registry.rstrip('/')}/{name}"
    return f"fiber-{name}"


class DockerImageBuilder(ImageBuilder):
    """Builds and pushes a program's image with a Docker engine (module docstring)."""

    name = "docker"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        host = options.get("docker_host")
        self._address = host or os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE
        self._source = ("the docker_host setting" if host else
                        "DOCKER_HOST" if os.environ.get("DOCKER_HOST") else "the default")
        self._client: docker.DockerClient | None = None

    def _connect(self) -> docker.DockerClient:
        if self._client is None:
            try:
                self._client = docker.DockerClient(base_url=self._address, version="auto",
                                                   timeout=STREAM_TIMEOUT)
            except docker_errors.DockerException as exc:
                raise ImageBuildError(str(classify(
                    exc, self._address, "build an image", False,
                    f"(that address is from {self._source}) start a Docker engine or point "
                    "the docker_host setting (FIBER_DOCKER_HOST) at one: fiber builds "
                    "images with it", STREAM_TIMEOUT))) from None
        return self._client

    # -- the steps ------------------------------------------------------------------
    def _context(self, request: ImageRequest, say: Callable[[str], None]
                 ) -> contexts.Context:
        directory = Path(request.directory)
        if not directory.is_dir():
            raise ImageBuildError(f"cannot build an image of {request.directory}: no such "
                                  "directory")
        try:
            if (directory / "Dockerfile").is_file():
                say(f"building from {directory / 'Dockerfile'}")
                return contexts.from_dockerfile(directory)
            base = request.base or contexts.default_base()
            imports = environment.program_imports(directory)
            dists = environment.needed(request.packages, imports)
            say(f"no Dockerfile in {directory}: making one from {base} with "
                f"{len(dists)} distributions of {sys.prefix} "
                f"({', '.join(d.metadata['Name'] for d in dists)}) and the program")
            return contexts.generated(directory, environment.site_files(dists), base)
        except (OSError, ValueError) as exc:
            raise ImageBuildError(f"cannot build an image of {request.directory}: "
                                  f"{exc}") from None

    def _in_registry(self, client: docker.DockerClient, reference: str) -> bool:
        try:
            client.api.inspect_distribution(reference)
            return True
        except docker_errors.APIError as exc:
            logger.debug("%s is not in its registry: %s", reference, exc)
            return False

    def _on_engine(self, client: docker.DockerClient, reference: str) -> bool:
        try:
            client.api.inspect_image(reference)
            return True
        except docker_errors.ImageNotFound:
            return False

    def _build(self, client: docker.DockerClient, context: contexts.Context,
               reference: str, request: ImageRequest, say: Callable[[str], None]) -> None:
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        started = time.monotonic()
        with tempfile.TemporaryFile(prefix="fiber-context-") as tar:
            context.write_tar(tar)
            size = tar.tell()
            tar.seek(0)
            say(f"building {reference} ({size / 1e6:.1f} MB of context)")
            error = None
            try:
                for event in client.api.build(fileobj=tar, custom_context=True,
                                              tag=reference, rm=True, forcerm=True,
                                              network_mode="host", decode=True):
                    text = event.get("stream") or event.get("status") or ""
                    for line in str(text).splitlines():
                        if line.strip():
                            tail.append(line.rstrip())
                            logger.debug("build: %s", line.rstrip())
                    if "error" in event:
                        error = str((event.get("errorDetail") or {}).get("message")
                                    or event["error"])
            except docker_errors.APIError as exc:
                error = str(exc.explanation or exc)
            except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
                raise ImageBuildError(str(classify(
                    exc, self._address, "build an image", True, "", STREAM_TIMEOUT))) from None
        if error is not None:
            what = ("the Dockerfile of " + request.directory if context.dockerfile is None
                    else "the image generated for " + request.directory)
            log = "\n".join(f"  {line}" for line in tail)
            raise ImageBuildError(f"{what} failed to build on the Docker engine at "
                                  f"{self._address}: {error}\nthe end of the build log:\n{log}")
        say(f"built {reference} in {time.monotonic() - started:.1f} s")

    def _push(self, client: docker.DockerClient, reference: str, registry: str,
              say: Callable[[str], None]) -> tuple[int, int]:
        repository, _, tag = reference.rpartition(":")
        pushed: set[str] = set()
        existing: set[str] = set()
        started = time.monotonic()
        try:
            for event in client.api.push(repository, tag=tag, stream=True, decode=True):
                if "error" in event:
                    message = (event.get("errorDetail") or {}).get("message") or event["error"]
                    raise ImageBuildError(
                        f"the registry {registry} (image_registry setting) refused the push "
                        f"of {reference}: {message}")
                status, layer = str(event.get("status", "")), event.get("id")
                if layer and status == "Pushed":
                    pushed.add(layer)
                elif layer and status == "Layer already exists":
                    existing.add(layer)
        except docker_errors.APIError as exc:
            raise ImageBuildError(
                f"the registry {registry} (image_registry setting) refused the push of "
                f"{reference}: {exc.explanation or exc}") from None
        say(f"pushed {reference} to {registry}: {len(pushed)} layers sent, "
            f"{len(existing)} already there ({time.monotonic() - started:.1f} s)")
        return len(pushed), len(existing)

    # -- the contract ---------------------------------------------------------------
    def build(self, request: ImageRequest, say: Callable[[str], None]) -> BuiltImage:
        context = self._context(request, say)
        reference = (f"{repository_name(request.directory, request.registry)}:"
                     f"{context.digest[:20]}")
        client = self._connect()
        try:
            if request.registry:
                if self._in_registry(client, reference):
                    say(f"{reference} is in the registry already: nothing to build or push")
                    return BuiltImage(reference, built=False)
                built = not self._on_engine(client, reference)
                if built:
                    self._build(client, context, reference, request, say)
                pushed, existing = self._push(client, reference, request.registry, say)
                return BuiltImage(reference, built=built, pushed=pushed,
                                  layers_existing=existing)
            if self._on_engine(client, reference):
                say(f"{reference} is on the engine already: nothing to build")
                return BuiltImage(reference, built=False)
            self._build(client, context, reference, request, say)
            return BuiltImage(reference, built=True)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise ImageBuildError(str(classify(
                exc, self._address, "build an image", False,
                f"(that address is from {self._source})", STREAM_TIMEOUT))) from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
