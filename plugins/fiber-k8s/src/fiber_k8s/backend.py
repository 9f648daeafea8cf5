"""The ``kubernetes`` backend: each job is a pod (restartPolicy Never).

Statuses come from one watch per backend instance over the pods it created (see
:mod:`fiber_k8s.watcher`), not from polling each pod. ``terminate`` deletes the pod
with a short grace period (none with ``force``); ``release`` deletes what is left.
The run's secret is a Kubernetes Secret the pods take it from (:mod:`fiber_k8s.secret`),
never a value in a pod spec.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

import urllib3
from kubernetes.client.rest import ApiException

from fiber.backend import (
    Backend,
    BackendError,
    ConfigError,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
    Resources,
)
from fiber_k8s import cluster, names
from fiber_k8s.manifest import (
    ANNOTATION_LABELS,
    ANNOTATION_NAME,
    INSTANCE_LABEL,
    MANAGED_BY,
    pod_manifest,
)
from fiber_k8s.secret import RUN_LABEL, RunSecrets, secret_name
from fiber_k8s.settings import parse_key_values, parse_tolerations
from fiber_k8s.status import CONTAINER, container_started, pod_status
from fiber_k8s.watcher import PodWatcher

logger = logging.getLogger("fiber.kubernetes")
API_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)


class KubernetesBackend(Backend):
    """Jobs as pods of a Kubernetes cluster."""

    name = "kubernetes"
    capabilities = frozenset({"logs", "list_jobs", "images"})
    resource_fields = frozenset({"cpu", "memory", "gpu", "walltime"})
    #: Resources.extra["kubernetes"] keys (see fiber_k8s.manifest)
    resource_extras = frozenset({"node_selector", "tolerations", "resources",
                                 "priority_class_name"})

    def check_resources(self, resources: Resources) -> None:
        """The default checks, then the job's own node selector, tolerations and extra
        resources must parse (a bad one is refused before any pod is made)."""
        super().check_resources(resources)
        extra = resources.extra_for(self.name)
        try:
            for key in ("node_selector", "resources"):
                value = extra.get(key) or {}
                parse_key_values(value if isinstance(value, str) else dict(value))
            if isinstance(extra.get("tolerations"), str):
                parse_tolerations(extra["tolerations"])
        except ValueError as exc:
            raise ConfigError(f"bad kubernetes resource request: {exc}") from None
    poll_interval = 0.5
    secrets_delivery = "private"  # a Secret of the run, referenced by the pods
    # create_jobs/terminate_jobs (the contract's defaults) make this many API calls at
    # once, from threads sharing one ApiClient (urllib3's pool is thread-safe; its
    # default size is 5 per core, 10 on the smallest machines)
    max_parallel_calls = 8

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._lock = threading.RLock()
        self._conn: cluster.Connection | None = None
        self._watcher: PodWatcher | None = None
        self._parent: Any = None
        self._parent_looked_up = False
        self.instance = uuid.uuid4().hex[:12]
        self._cancelled: dict[str, bool] = {}  # pod name -> forced
        self._live: dict[str, Job] = {}
        self._secrets = RunSecrets(lambda: self.conn.api, lambda: self.conn.namespace,
                                   self.instance, self._owner, MANAGED_BY)
        self._secret_of: dict[str, str] = {}  # pod name -> the Secret it takes secrets from

    # -- connection ----------------------------------------------------------------
    @property
    def conn(self) -> cluster.Connection:
        with self._lock:
            if self._conn is None:
                self._conn = cluster.connect(dict(self.options))
            return self._conn

    def _error(self, exc: BaseException, what: str) -> BackendError:
        return cluster.translate(exc, what, self.conn.namespace, self.conn.host)

    def _ensure_watcher(self) -> PodWatcher:
        with self._lock:
            if self._watcher is None:
                self._watcher = PodWatcher(self.conn.api, self.conn.namespace,
                                           f"{INSTANCE_LABEL}={self.instance}")
                self._watcher.start()
            return self._watcher

    def parent_pod(self) -> Any:
        """The pod this process runs in (when in a cluster and readable), else None."""
        with self._lock:
            if not self._parent_looked_up:
                self._parent_looked_up = True
                if self.conn.in_cluster:
                    self._parent = self._read_own_pod()
            return self._parent

    def _read_own_pod(self) -> Any:
        name = cluster.own_pod_name()
        try:
            namespace = (cluster.SERVICE_ACCOUNT_DIR / "namespace").read_text().strip()
        except OSError:
            namespace = self.conn.namespace
        try:
            return self.conn.api.read_namespaced_pod(name, namespace)
        except API_ERRORS as exc:
            logger.warning("cannot read this process's own pod %s/%s (%s); set FIBER_IMAGE "
                           "and kubernetes_listen_address explicitly", namespace, name, exc)
            return None

    # -- creating ------------------------------------------------------------------
    def _image(self, spec: JobSpec) -> str:
        image = spec.image or self.options.get("image")
        if image:
            return image
        parent = self.parent_pod()
        if parent is not None:
            return parent.spec.containers[0].image
        raise JobCreationError(
            "no container image for the job: set the image setting (FIBER_IMAGE=...) to an "
            "image that contains this Python and fiber, or run the parent in a pod (its "
            "own image is then used)"
        )

    def _owner(self) -> dict | None:
        parent = self.parent_pod()
        if parent is None or parent.metadata.namespace != self.conn.namespace:
            return None  # owner references cannot cross namespaces
        return {"apiVersion": "v1", "kind": "Pod", "name": parent.metadata.name,
                "uid": parent.metadata.uid, "blockOwnerDeletion": False, "controller": False}

    def _use_secret(self, spec: JobSpec) -> str | None:
        if not spec.secrets:
            return None
        try:
            return self._secrets.use(spec)
        except API_ERRORS as exc:
            raise self._error(exc, f"create the run's Secret for job {spec.name!r}") from exc

    def _unuse_secret(self, name: str) -> None:
        try:
            self._secrets.unuse(name)
        except API_ERRORS as exc:
            raise self._error(exc, f"delete the run's Secret {name}") from exc

    def create_job(self, spec: JobSpec) -> Job:
        conn = self.conn
        pod_name = names.pod_name(spec.name)
        image = self._image(spec)
        secret = self._use_secret(spec)
        try:
            body = pod_manifest(spec, pod_name=pod_name, namespace=conn.namespace,
                                image=image, instance=self.instance,
                                options=self.options, owner=self._owner(),
                                secret_name=secret)
            watcher = self._ensure_watcher()
            try:
                pod = conn.api.create_namespaced_pod(conn.namespace, body)  # type: ignore[arg-type]  # the client also takes the manifest as a dict
            except API_ERRORS as exc:
                raise self._error(exc, f"create pod for job {spec.name!r}") from exc
        except BaseException:
            if secret is not None:
                self._unuse_secret(secret)
            raise
        watcher.expect(pod)
        job = Job(id=pod_name, backend=self.name, spec=spec,  # the pod has the name we chose
                  handle=conn.namespace)
        with self._lock:
            self._live[job.id] = job
            if secret is not None:
                self._secret_of[job.id] = secret
        logger.debug("created pod %s/%s for job %s", conn.namespace, job.id, spec.name)
        return job

    # -- status --------------------------------------------------------------------
    def _status_of(self, name: str, pod: Any, deleted: bool, pull_since: float | None,
                   ) -> JobStatus:
        status = pod_status(pod, pull_since, time.monotonic(),
                            self.options.get("kubernetes_pull_timeout") or 120.0)
        forced = self._cancelled.get(name)
        if forced is not None and status.state is not JobState.SUCCEEDED:
            if forced and (status.is_final or deleted):
                # killed on request: multiprocessing's kill() convention (the kubelet
                # itself stops a container with SIGTERM, then SIGKILL 2 s later)
                return JobStatus(JobState.CANCELLED, -signal.SIGKILL,
                                 "SIGKILL: the pod was deleted by kill()")
            if status.is_final:
                return JobStatus(JobState.CANCELLED, status.exitcode, status.reason)
            if deleted:
                return JobStatus(JobState.CANCELLED, -signal.SIGTERM, "SIGTERM")
            return status
        deleting = deleted or getattr(getattr(pod, "metadata", None), "deletion_timestamp", None)
        if deleting and status.state is not JobState.SUCCEEDED:
            if status.is_final:  # ended because someone deleted the pod
                return JobStatus(JobState.CANCELLED, status.exitcode,
                                 "Deleted: the pod was deleted on the cluster")
            if deleted:
                return JobStatus(JobState.CANCELLED, -signal.SIGTERM,
                                 "Deleted: the pod was deleted on the cluster")
        return status

    def status(self, job: Job) -> JobStatus:
        watcher = self._watcher
        record = watcher.get(job.id) if watcher is not None else None
        if watcher is not None and record is not None and (watcher.synced.is_set()
                                                           or record.deleted):
            return self._status_of(job.id, record.pod, record.deleted, record.pull_failing_since)
        # not one of ours, or the watch is not running: ask directly
        try:
            pod = self.conn.api.read_namespaced_pod(job.id, job.handle or self.conn.namespace)
        except ApiException as exc:
            if exc.status == 404:
                if job.id in self._cancelled:
                    sig = signal.SIGKILL if self._cancelled[job.id] else signal.SIGTERM
                    return JobStatus(JobState.CANCELLED, -sig, "Deleted")
                return JobStatus(JobState.LOST, None, "the pod no longer exists")
            raise self._error(exc, f"read pod {job.id}") from exc
        except API_ERRORS as exc:
            raise self._error(exc, f"read pod {job.id}") from exc
        return self._status_of(job.id, pod, False, None)

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        watcher = self._watcher
        while True:
            status = self.status(job)
            if status.is_final:
                return status
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            pause = 1.0 if remaining is None else min(1.0, remaining)
            if watcher is not None and watcher.get(job.id) is not None:
                with watcher.changed:
                    watcher.changed.wait(pause)
            else:
                time.sleep(min(pause, self.poll_interval))

    # -- ending --------------------------------------------------------------------
    def _delete(self, job: Job, grace: int) -> None:
        try:
            self.conn.api.delete_namespaced_pod(
                job.id, job.handle or self.conn.namespace, grace_period_seconds=grace,
                propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise self._error(exc, f"delete pod {job.id}") from exc
        except API_ERRORS as exc:
            raise self._error(exc, f"delete pod {job.id}") from exc

    def _started(self, job: Job) -> bool | None:
        """Whether the job's container has started, from a fresh read of the pod (the
        watch's copy may lag); None when the pod is gone."""
        try:
            pod = self.conn.api.read_namespaced_pod(job.id, job.handle or self.conn.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise self._error(exc, f"read pod {job.id}") from exc
        except API_ERRORS as exc:
            raise self._error(exc, f"read pod {job.id}") from exc
        return container_started(pod)

    def terminate(self, job: Job, force: bool = False) -> None:
        status = self.status(job)
        if status.is_final:
            return
        self._cancelled[job.id] = force or self._cancelled.get(job.id, False)
        # A pod whose container has not started yet goes at once (0 s), for terminate()
        # and kill() alike: with a grace period the pod stays until the kubelet has
        # finished creating it and then stopped it, and the kubelet (1.20) may wait up to
        # two minutes for the volumes of a pod deleted while it was being created.
        # Nothing of the job has run, so reporting it ended at once is true.
        # Once the container runs, kill() deletes with 1 s, not 0: a pod deleted with 0
        # leaves the API at once while its container still runs until the kubelet stops
        # it, so the job would be reported ended while alive. With 1 s the pod stays
        # until the kubelet has stopped the container (SIGTERM, SIGKILL after at most 2 s).
        if status.state is JobState.PENDING and not self._started(job):
            grace = 0
        elif force:
            grace = 1
        else:
            grace = max(1, round(self.options.get("kubernetes_grace_period") or 3))
        logger.debug("deleting pod %s (%s) with a grace period of %d s", job.id,
                     "kill" if force else "terminate", grace)
        self._delete(job, grace)

    def release(self, job: Job) -> None:
        self._delete(job, 0)
        if self._watcher is not None:
            self._watcher.forget(job.id)
        with self._lock:
            ours = self._live.pop(job.id, None) is not None
            secret = self._secret_of.pop(job.id, None)
        if secret is not None:
            self._unuse_secret(secret)
        elif not ours and RUN_LABEL in job.spec.labels:
            # a job another process created (fiber clean): its run's Secret goes
            # with the run's last pod
            self._delete_secret_of_ended_run(job.spec.labels[RUN_LABEL],
                                             job.handle or self.conn.namespace)

    def _delete_secret_of_ended_run(self, run: str, namespace: str) -> None:
        name = secret_name(run)
        if namespace != self.conn.namespace or self._secrets.in_use(name):
            return
        try:
            pods = self.conn.api.list_namespaced_pod(
                namespace, label_selector=names.selector({RUN_LABEL: run}))
            if any(pod.metadata is not None and pod.metadata.deletion_timestamp is None
                   for pod in pods.items):
                return  # the run still has pods
            self._secrets.delete(name)
        except API_ERRORS as exc:
            raise self._error(exc, f"delete the Secret {name} of run {run}") from exc

    # -- the rest ------------------------------------------------------------------
    def logs(self, job: Job) -> str:
        try:
            text = self.conn.api.read_namespaced_pod_log(
                job.id, job.handle or self.conn.namespace, container=CONTAINER)
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone
                return ""
            raise self._error(exc, f"read the log of pod {job.id}") from exc
        except API_ERRORS as exc:
            raise self._error(exc, f"read the log of pod {job.id}") from exc
        return text if isinstance(text, str) else str(text)

    def listen_address(self) -> str:
        """``kubernetes_listen_address`` when it is an address of this machine (a child
        inherits its parent's setting, which is not its own address); else, in a pod,
        the pod's IP; else this machine's address on the route to the API server."""
        address = self.options.get("kubernetes_listen_address")
        if address and cluster.is_local_address(address):
            return address
        if address:
            logger.debug("kubernetes_listen_address %s is not an address of this machine; "
                         "using this pod's address", address)
        if os.environ.get("POD_IP"):
            return os.environ["POD_IP"]
        if self.conn.in_cluster:
            parent = self.parent_pod()
            if parent is not None and parent.status.pod_ip:
                return parent.status.pod_ip
        return address or cluster.local_address_towards(self.conn.host)

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        try:
            pods = self.conn.api.list_namespaced_pod(
                self.conn.namespace, label_selector=names.selector(dict(labels)))
        except API_ERRORS as exc:
            raise self._error(exc, "list pods") from exc
        jobs = []
        for pod in pods.items:
            meta, pod_spec = pod.metadata, pod.spec
            if meta is None or meta.name is None or pod_spec is None:
                continue  # (never: the API server fills them in every pod it lists)
            annotations = meta.annotations or {}
            try:
                job_labels = json.loads(annotations.get(ANNOTATION_LABELS, "{}"))
            except ValueError:
                job_labels = dict(meta.labels or {})
            container = pod_spec.containers[0]
            spec = JobSpec(command=list(container.command or []), image=container.image,
                           name=annotations.get(ANNOTATION_NAME, meta.name),
                           labels=job_labels, cwd=container.working_dir)
            jobs.append(Job(id=meta.name, backend=self.name, spec=spec,
                            host=pod_spec.node_name, handle=meta.namespace))
        return jobs

    def close(self) -> None:
        with self._lock:
            live = list(self._live.values())
            self._live.clear()
            watcher, self._watcher = self._watcher, None
        for job in live:
            try:
                self.release(job)
            except BackendError as exc:
                logger.warning("could not delete pod %s: %s", job.id, exc)
        if self._conn is not None:
            try:
                self._secrets.close()
            except API_ERRORS as exc:
                logger.warning("could not delete the run's Secret in namespace %s: %s "
                               "(`kubectl delete secret -l fiber.run` removes it)",
                               self._conn.namespace, exc)
        if watcher is not None:
            watcher.stop()
        if self._conn is not None:
            self._conn.api.api_client.close()
