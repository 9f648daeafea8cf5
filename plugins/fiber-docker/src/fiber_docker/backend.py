"""The ``docker`` backend: every job is a container on a Docker engine.

A job's container runs ``spec.command`` as is in the job's image (``spec.image``, else
the ``image`` setting, else the image of the container this process runs in), with
exactly ``spec.env``, ``spec.cwd`` as working directory, Docker's init as PID 1 (so
SIGTERM reaches the command) and the host's network unless ``docker_network`` is set.
The run's secret (``spec.secrets``) is copied into the created container, before it
starts, as a secrets file (``/.fiber-secrets/secrets``, mode 0600, owned by the image's
user; see :mod:`fiber_docker.secretfile`) whose path is the container's
``_FIBER_SECRETS_FILE``: ``docker inspect`` shows the path, never the secret; the job
removes the file once read, and the container goes with it.
cpu, memory and gpu requests become container limits; ``spec.labels`` become
container labels, which is how :meth:`DockerBackend.list_jobs` and
:meth:`DockerBackend.poll` find a run's containers with one engine call. Ended
containers are removed by :meth:`DockerBackend.release` unless
``docker_keep_containers`` is set.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import docker
import requests
from docker import errors as docker_errors
from docker.types import DeviceRequest, Mount

from fiber.backend import (
    SECRETS_FILE_ENV,
    Backend,
    ClusterUnreachableError,
    ConfigError,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
)
from fiber_docker import secretfile, selfcontainer
from fiber_docker.engine_errors import classify
from fiber_docker.status import to_status
from fiber_docker.volumes import Volume, is_under, parse_volume, parse_volumes

logger = logging.getLogger("fiber.docker")

T = TypeVar("T")

RUN_LABEL = "fiber.run"
BACKEND_LABEL = "fiber.backend"
NAME_LABEL = "fiber.name"
DEFAULT_ENGINE = "unix:///var/run/docker.sock"
#: seconds an engine call may take before it is retried (setting docker_timeout)
DEFAULT_TIMEOUT = 60
_LIVE_STATES = {"created": JobState.PENDING, "running": JobState.RUNNING,
                "restarting": JobState.RUNNING, "paused": JobState.RUNNING}
# Working directories never bind-mounted from the host (they would hide the image).
_SYSTEM_DIRS = {"/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run",
                "/sbin", "/sys", "/usr", "/var"}


def names_registry(image: str) -> bool:
    """Whether ``image`` names the registry it comes from (``host:port/...``,
    ``registry.example.com/...``, ``localhost/...``): such an image is pulled when the
    engine lacks it."""
    first, sep, _ = image.partition("/")
    return bool(sep) and ("." in first or ":" in first or first == "localhost")


def _container_name(spec_name: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", spec_name).strip("-_.")[:40] or "job"
    if not safe.startswith("fiber"):
        safe = "fiber-" + safe
    return f"{safe}-{uuid.uuid4().hex[:8]}"


class DockerBackend(Backend):
    """Jobs as containers of one Docker engine (see the module docstring)."""

    name = "docker"
    capabilities = frozenset({"logs", "list_jobs", "images"})
    poll_interval = 0.5
    secrets_delivery = "private"  # a file copied into the container (secretfile)
    # create_jobs/terminate_jobs (the contract's defaults) make this many engine calls
    # at once, from threads sharing the client (docker-py's client is safe to share):
    # below docker-py's connection pool of 10, so no call waits for a connection
    max_parallel_calls = 8
    resource_fields = frozenset({"cpu", "memory", "gpu"})
    #: Resources.extra["docker"] keys: create_host_config options of the same name
    resource_extras = frozenset({"shm_size", "cpuset_cpus", "pids_limit", "cpu_shares"})

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        raw = options.get("docker_volumes")
        try:
            self._volumes: list[Volume] = [parse_volume(v) for v in parse_volumes(raw or [])]
        except ValueError as exc:
            raise ConfigError(
                f"bad value {raw!r} for setting 'docker_volumes' (FIBER_DOCKER_VOLUMES): {exc}"
            ) from None
        self._network: str | None = options.get("docker_network") or None
        self._mount_cwd = bool(options.get("docker_mount_cwd", True))
        self._mount_socket = bool(options.get("docker_mount_socket", True))
        self._keep = bool(options.get("docker_keep_containers", False))
        self._pid_host = bool(options.get("docker_pid_host", True))
        self._lock = threading.RLock()
        self._pull_lock = threading.Lock()
        self._client: docker.DockerClient | None = None
        self._address = ""
        self._own: dict | None = None
        self._own_checked = False
        self._final: dict[str, JobStatus] = {}
        self._cancelled: set[str] = set()
        self._jobs: dict[str, Job] = {}
        self._image_users: dict[str, str] = {}
        self._timeout = int(options.get("docker_timeout") or DEFAULT_TIMEOUT)
        self._reached = False  # this backend has talked to the engine (engine_errors)
        # containers whose create or start call failed transiently (a time-out): the
        # engine may still have made them, so close() removes them by name
        self._unsure: set[str] = set()

    # -- engine connection --------------------------------------------------------
    def _engine_hint(self) -> str:
        return (
            "start the engine (`sudo systemctl start docker`, or run `dockerd`) or point the "
            "docker_host setting (FIBER_DOCKER_HOST) or DOCKER_HOST at a running engine"
        )

    def _connect(self) -> docker.DockerClient:
        with self._lock:
            if self._client is not None:
                return self._client
            host = self.options.get("docker_host")
            if host:
                address, source = host, "from the docker_host setting"
            else:
                address = os.environ.get("DOCKER_HOST") or DEFAULT_ENGINE
                source = "from DOCKER_HOST" if os.environ.get("DOCKER_HOST") else "the default"
            try:
                if host:
                    client = docker.DockerClient(base_url=host, version="auto",
                                                 timeout=self._timeout)
                else:
                    client = docker.from_env(version="auto", timeout=self._timeout)
            except docker_errors.DockerException as exc:
                raise classify(exc, address, "ask for its version", self._reached,
                               f"(that address is {source}) " + self._engine_hint(),
                               self._timeout) from None
            self._reached = True
            self._client, self._address = client, address
            logger.debug("connected to the Docker engine at %s", address)
            return client

    def _api(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one engine call, turning an engine that cannot be reached or does not
        answer into ClusterUnreachableError (transient or not: engine_errors)."""
        try:
            return call(*args, **kwargs)
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise classify(exc, self._address, what, self._reached, self._engine_hint(),
                           self._timeout) from None

    # -- this process's own container ---------------------------------------------
    def _own_container(self) -> dict | None:
        """The engine's inspection of the container this process runs in, if any."""
        with self._lock:
            if self._own_checked:
                return self._own
            self._own_checked = True
            container_id = selfcontainer.own_container_id()
            if container_id:
                client = self._connect()
                try:
                    self._own = self._api("inspect this container",
                                          client.api.inspect_container, container_id)
                except docker_errors.NotFound:
                    logger.debug("container %s is not on the engine at %s", container_id,
                                 self._address)
            return self._own

    def _engine_path(self, path: str) -> str | None:
        """``path`` of this process as a path on the engine's machine (for bind
        mounts), or None when it exists only inside this process's container."""
        own = self._own_container()
        if own is None:
            return path
        best: dict | None = None
        for mount in own.get("Mounts") or []:
            dest = mount.get("Destination") or ""
            if mount.get("Type") == "bind" and dest and is_under(path, dest):
                if best is None or len(dest) > len(best["Destination"]):
                    best = mount
        if best is None:
            return None
        return best["Source"].rstrip("/") + path[len(best["Destination"].rstrip("/")):]

    def _image(self, spec: JobSpec) -> str:
        image = spec.image or self.options.get("image")
        if image:
            return image
        own = self._own_container()
        if own is not None:
            return own["Image"]
        self._connect()
        raise JobCreationError(
            "no image for docker jobs: set the image setting (FIBER_IMAGE=<image> or "
            "fiber.init(image=...)) to an image that has this Python "
            f"({sys.executable}) with fiber installed at the same path; there is no default "
            f"because this process does not run in a container of the engine at {self._address}"
        )

    # -- creating jobs ------------------------------------------------------------
    def _mounts(self, spec: JobSpec, env: dict[str, str]) -> list[Mount]:
        mounts = [
            Mount(target=v.target, source=v.source, type="bind" if v.is_bind else "volume",
                  read_only=v.read_only)
            for v in self._volumes
        ]
        targets = [v.target for v in self._volumes]
        cwd = spec.cwd
        if (self._mount_cwd and cwd and cwd.startswith("/") and cwd not in _SYSTEM_DIRS
                and not any(is_under(cwd, t) for t in targets)):
            source = self._engine_path(cwd)
            if source is None:
                logger.debug("not mounting %s: it exists only in this container", cwd)
            else:
                mounts.append(Mount(target=cwd, source=source, type="bind"))
                targets.append(cwd)
        if self._mount_socket and self._address.startswith("unix://"):
            socket_path = self._address[len("unix://"):]
            source = self._engine_path(socket_path)
            if source and not any(is_under(socket_path, t) for t in targets):
                mounts.append(Mount(target=socket_path, source=source, type="bind"))
            if "DOCKER_HOST" not in env and "FIBER_DOCKER_HOST" not in env:
                env["DOCKER_HOST"] = self._address
        return mounts

    def _host_config(self, client: docker.DockerClient, spec: JobSpec,
                     mounts: list[Mount]) -> dict:
        cpu = spec.cpu if spec.cpu is not None else self.options.get("cpu")
        memory = spec.memory if spec.memory is not None else self.options.get("memory")
        gpu = spec.gpu if spec.gpu is not None else self.options.get("gpu")
        limits: dict[str, Any] = {}
        if cpu:
            limits["nano_cpus"] = int(float(cpu) * 1e9)
        if memory:
            limits["mem_limit"] = f"{int(memory)}m"
            limits["memswap_limit"] = f"{int(memory)}m"
        if gpu:
            limits["device_requests"] = [DeviceRequest(count=int(gpu), capabilities=[["gpu"]])]
        if self._pid_host:
            limits["pid_mode"] = "host"
        # the job's own requests (Resources.extra["docker"]): host-config options
        for key, value in (getattr(spec, "extra", None) or {}).items():
            limits[key] = value
        return client.api.create_host_config(
            init=True, network_mode=self._network or "host", mounts=mounts, **limits
        )

    def _refused(self, action: str, spec: JobSpec, image: str, exc: Exception) -> JobCreationError:
        text = getattr(exc, "explanation", None) or str(exc)
        hint = ""
        if "bind source path does not exist" in text:
            hint = (" (a bind mount's host path is missing on the engine's machine: check the "
                    "docker_volumes setting, or set docker_mount_cwd=false when the engine runs "
                    "on another machine)")
        elif "capabilities: [[gpu]]" in text:
            hint = (" (a GPU was requested but the engine has no GPU support: install the NVIDIA "
                    "container toolkit there, or do not request gpu)")
        elif "network" in text and self._network:
            hint = f" (check the docker_network setting {self._network!r}: `docker network ls`)"
        return JobCreationError(
            f"the Docker engine at {self._address} could not {action} job {spec.name!r} "
            f"(image {image!r}): {text}{hint}"
        )

    def create_job(self, spec: JobSpec) -> Job:
        if not spec.command:
            raise JobCreationError(f"job {spec.name!r} has an empty command")
        client = self._connect()
        image = self._image(spec)
        env = {str(k): str(v) for k, v in spec.env.items()}
        if self._pid_host:  # the init is no PID 1 then: make it a subreaper instead
            env.setdefault("TINI_SUBREAPER", "1")
        mounts = self._mounts(spec, env)
        if spec.secrets:
            env[SECRETS_FILE_ENV] = secretfile.PATH
        labels = {str(k): str(v) for k, v in spec.labels.items()}
        labels.update({BACKEND_LABEL: self.name, NAME_LABEL: spec.name})
        name = _container_name(spec.name)
        for attempt in (1, 2):
            try:
                created = self._api(
                    "create a container", client.api.create_container,
                    image=image, command=list(spec.command), environment=env,
                    working_dir=spec.cwd or None, labels=labels, name=name,
                    host_config=self._host_config(client, spec, mounts), detach=True,
                )
                break
            except ClusterUnreachableError:
                with self._lock:
                    self._unsure.add(name)  # the engine may have made it all the same
                raise
            except docker_errors.ImageNotFound:
                if attempt == 1 and names_registry(image):
                    self._pull(client, image)
                    continue
                raise JobCreationError(
                    f"image {image!r} is not on the Docker engine at {self._address}: build "
                    "it (`fiber build`, `docker build` / `docker import`) or pull it (`docker "
                    f"pull {image}`) on that engine, or set the image setting (FIBER_IMAGE) "
                    "to an image the engine has"
                ) from None
            except docker_errors.APIError as exc:
                raise self._refused("create a container for", spec, image, exc) from None
        container_id = created["Id"]
        if spec.secrets:
            self._put_secrets(client, container_id, spec, image)
        try:
            self._api("start a container", client.api.start, container_id)
        except docker_errors.APIError as exc:
            self._remove(container_id)
            raise self._refused("start", spec, image, exc) from None
        except ClusterUnreachableError:
            with self._lock:
                self._unsure.add(container_id)  # it may start yet: close() removes it
            raise
        host = "localhost" if self._address.startswith("unix://") else self._address
        job = Job(id=container_id, backend=self.name, spec=spec, host=host)
        with self._lock:
            self._jobs[container_id] = job
        logger.debug("job %s is container %s (image %s)", spec.name, container_id[:12], image)
        return job

    def _pull(self, client: docker.DockerClient, image: str) -> None:
        """Pull ``image`` (which names its registry) onto the engine, once for all the
        jobs that miss it."""
        with self._pull_lock:
            try:
                self._api("inspect an image", client.api.inspect_image, image)
                return  # another job's pull brought it
            except docker_errors.ImageNotFound:
                pass
            repository, _, tag = image.rpartition(":")
            if "/" in tag or not repository:
                repository, tag = image, "latest"
            logger.info("pulling %s onto the Docker engine at %s", image, self._address)
            try:
                self._api("pull an image", client.api.pull, repository, tag=tag)
            except docker_errors.APIError as exc:
                raise JobCreationError(
                    f"image {image!r} is not on the Docker engine at {self._address}, and "
                    f"pulling it failed: {exc.explanation or exc}") from None

    def _image_user(self, client: docker.DockerClient, image: str) -> str:
        with self._lock:
            if image in self._image_users:
                return self._image_users[image]
        user = str((self._api("inspect an image", client.api.inspect_image, image)
                    .get("Config") or {}).get("User") or "")
        with self._lock:
            self._image_users[image] = user
        return user

    def _put_secrets(self, client: docker.DockerClient, container_id: str, spec: JobSpec,
                     image: str) -> None:
        """Copy the job's secrets file into its created container (removed if it
        cannot be: no job is left behind)."""
        try:
            archive = secretfile.archive(spec.secrets, self._image_user(client, image))
            self._api("copy the secrets file into a container", client.api.put_archive,
                      container_id, "/", archive)
        except (docker_errors.APIError, ValueError) as exc:
            self._remove(container_id)
            raise self._refused("copy the run's secret into the container of", spec,
                                image, exc) from None
        except BaseException:
            self._remove(container_id)
            raise

    # -- watching jobs ------------------------------------------------------------
    def _final_status(self, job_id: str) -> JobStatus | None:
        with self._lock:
            return self._final.get(job_id)

    def status(self, job: Job) -> JobStatus:
        cached = self._final_status(job.id)
        if cached is not None:
            return cached
        client = self._connect()
        try:
            attrs = self._api("inspect a container", client.api.inspect_container, job.id)
        except docker_errors.NotFound:
            return JobStatus(JobState.LOST, reason="container removed")
        with self._lock:
            status = to_status(attrs.get("State") or {}, job.id in self._cancelled)
            if status.is_final:
                self._final[job.id] = status
        return status

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        result: dict[str, JobStatus] = {}
        by_run: dict[str, list[Job]] = {}
        for job in jobs:
            cached = self._final_status(job.id)
            if cached is not None:
                result[job.id] = cached
            elif RUN_LABEL in job.spec.labels:
                by_run.setdefault(job.spec.labels[RUN_LABEL], []).append(job)
            else:
                result[job.id] = self.status(job)
        if not by_run:
            return result
        client = self._connect()
        for run, group in by_run.items():
            rows = self._api("list containers", client.api.containers, all=True,
                             filters={"label": f"{RUN_LABEL}={run}"})
            states = {row["Id"]: str(row.get("State", "")).lower() for row in rows}
            for job in group:
                state = states.get(job.id)
                if state in _LIVE_STATES:
                    result[job.id] = JobStatus(_LIVE_STATES[state])
                else:  # ended or gone: one inspection, then cached
                    result[job.id] = self.status(job)
        return result

    def logs(self, job: Job) -> str:
        client = self._connect()
        try:
            data = self._api("read a container's logs", client.api.logs, job.id,
                             stdout=True, stderr=True)
        except docker_errors.NotFound:
            return ""
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    # -- ending jobs --------------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        if self._final_status(job.id) is not None:
            return
        client = self._connect()
        with self._lock:
            self._cancelled.add(job.id)
        try:
            self._api("signal a container", client.api.kill, job.id,
                      signal="SIGKILL" if force else "SIGTERM")
        except docker_errors.NotFound:
            return
        except docker_errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running
                raise
            try:
                state = client.api.inspect_container(job.id).get("State") or {}
            except docker_errors.NotFound:
                return
            if str(state.get("Status")) == "created":  # never started: it will not run now
                with self._lock:
                    self._final[job.id] = JobStatus(JobState.CANCELLED, reason="never started")
                self._remove(job.id)
            else:
                with self._lock:
                    self._cancelled.discard(job.id)

    def _remove(self, job_id: str) -> None:
        try:
            self._api("remove a container", self._connect().api.remove_container, job_id,
                      force=True, v=True)
        except docker_errors.NotFound:
            pass
        except docker_errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    def release(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)
            known = job.id in self._final
        if not known:
            self.status(job)  # remember how it ended before the container goes
        if self._keep:
            logger.info("keeping container %s of job %s (docker_keep_containers)",
                        job.id[:12], job.spec.name)
            return
        self._remove(job.id)

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        client = self._connect()
        wanted = [f"{k}={v}" for k, v in labels.items()] or [RUN_LABEL]
        rows = self._api("list containers", client.api.containers, all=True,
                         filters={"label": wanted})
        host = "localhost" if self._address.startswith("unix://") else self._address
        jobs = []
        for row in rows:
            row_labels = dict(row.get("Labels") or {})
            spec = JobSpec(
                command=shlex.split(row.get("Command") or ""),
                image=row.get("Image"),
                name=row_labels.get(NAME_LABEL, (row.get("Names") or ["?"])[0].lstrip("/")),
                labels=row_labels,
            )
            jobs.append(Job(id=row["Id"], backend=self.name, spec=spec, host=host))
        return jobs

    # -- addresses and shutdown ---------------------------------------------------
    def listen_address(self) -> str:
        if self._network in (None, "host", "none"):
            return "127.0.0.1"
        client = self._connect()
        try:
            network = self._api("inspect a network", client.api.inspect_network, self._network)
        except docker_errors.NotFound:
            raise ClusterUnreachableError(
                f"the Docker network {self._network!r} (docker_network setting) does not exist "
                f"on the engine at {self._address}: create it (`docker network create "
                f"{self._network}`) or unset docker_network to use the host's network"
            ) from None
        for entry in (network.get("IPAM") or {}).get("Config") or []:
            if entry.get("Gateway"):
                return str(entry["Gateway"]).split("/")[0]
        return "127.0.0.1"

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            unsure, self._unsure = self._unsure, set()
            client, self._client = self._client, None
        if client is None:
            return
        self._client = client
        try:
            for job in jobs:
                try:
                    self.terminate(job, force=True)
                    self.release(job)
                except Exception:  # noqa: BLE001 - closing is best effort
                    logger.debug("cleaning up container %s failed", job.id[:12], exc_info=True)
            for name in unsure:
                try:
                    self._remove(name)
                except Exception:  # noqa: BLE001 - closing is best effort
                    logger.debug("removing container %s failed", name, exc_info=True)
        finally:
            with self._lock:
                self._client = None
            client.close()
