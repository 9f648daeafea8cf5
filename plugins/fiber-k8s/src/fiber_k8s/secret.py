"""The run's secret as a Kubernetes Secret: one per run and namespace, named after the
run (``fiber-secrets-<run>``) and labelled with it (``fiber.run``), whose keys are the
names of ``JobSpec.secrets``; a job's pod takes each from it as an environment
variable (``valueFrom.secretKeyRef``), so the pod spec names the Secret and never holds
a value. Reading a Secret takes the ``get secrets`` right the pods' readers need not
have (rbac.yaml grants the backend create/get/delete on secrets).

The backend instance that creates the Secret (the run's first process to start a job
in the namespace) owns it: it counts its pods that use it and deletes it when its last
one is released, which is at the end of the run at the latest, and creates it again
for a later job. A process of the run that finds it there (a job that starts jobs of
its own) uses it without owning it. The counting is the process's, not an
instance's: several backend instances of one process (a context per backend settings)
share the run's Secret, and it goes only when the process's last pod using it does (an
instance that counted alone deleted it under another instance's pods starting: their
containers failed with 'secret not found'). In a pod, the Secret is also owned (Kubernetes
``ownerReferences``) by the pod of the process that created it, so Kubernetes deletes
it if that process's pod goes without cleaning up; ``fiber clean`` deletes the Secret
of a run whose last pod it removes.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from fiber.backend import JobSpec
from fiber_k8s import names

logger = logging.getLogger("fiber.kubernetes")

RUN_LABEL = "fiber.run"
PREFIX = "fiber-secrets-"


def secret_name(run: str) -> str:
    """The Secret's name for the run ``run`` (a DNS-1123 subdomain of <= 253 chars)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", run.lower()).strip("-")
    if cleaned != run or len(cleaned) > 200:
        cleaned = f"{cleaned[:180].strip('-')}-{hashlib.sha256(run.encode()).hexdigest()[:8]}"
    return PREFIX + cleaned.strip("-")


def run_of(spec: JobSpec, instance: str) -> str:
    return spec.labels.get(RUN_LABEL) or f"instance-{instance}"


# the process's accounting, shared by its backend instances: (namespace, Secret name)
# -> pods of this process using it, and the Secrets this process created
_LOCK = threading.Lock()
_USERS: dict[tuple[str, str], int] = {}
_OWNED: set[tuple[str, str]] = set()


class RunSecrets:
    """The Secrets this backend instance uses (see the module docstring). ``call``
    runs one API call, turning its errors into fiber's (the backend's ``_api``)."""

    def __init__(self, api: Any, namespace: Callable[[], str], instance: str,
                 owner: Callable[[], dict | None], managed_by: dict[str, str]) -> None:
        self._api = api
        self._namespace = namespace
        self._instance = instance
        self._owner = owner
        self._managed_by = managed_by

    def use(self, spec: JobSpec) -> str:
        """The name of the Secret holding ``spec.secrets`` for a new pod, created when
        needed; the caller gives it back with :meth:`unuse` once the pod is gone (or
        was not created)."""
        run = run_of(spec, self._instance)
        name = secret_name(run)
        key = (self._namespace(), name)
        with _LOCK:
            if _USERS.get(key, 0) == 0:
                self._create(name, run, spec)
            _USERS[key] = _USERS.get(key, 0) + 1
        return name

    def _create(self, name: str, run: str, spec: JobSpec) -> None:
        namespace = self._namespace()
        metadata: dict[str, Any] = {
            "name": name, "namespace": namespace,
            "labels": {**names.labels({RUN_LABEL: run}), **self._managed_by}}
        owner = self._owner()
        if owner:
            metadata["ownerReferences"] = [owner]
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": metadata, "stringData": dict(spec.secrets)}
        try:
            self._api().create_namespaced_secret(namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # there already: another process of the run made it (a job starting jobs)
            _OWNED.discard((namespace, name))
            return
        _OWNED.add((namespace, name))
        logger.debug("created Secret %s/%s for run %s", namespace, name, run)

    def unuse(self, name: str) -> None:
        """One pod that used the Secret ``name`` is gone; the Secret goes with the
        process's last one when this process created it."""
        key = (self._namespace(), name)
        with _LOCK:
            left = _USERS.get(key, 0) - 1
            if left > 0:
                _USERS[key] = left
                return
            _USERS.pop(key, None)
            if key in _OWNED:
                self.delete(name)  # (raises when it cannot: close() tries again)
                _OWNED.discard(key)

    def in_use(self, name: str) -> bool:
        with _LOCK:
            return _USERS.get((self._namespace(), name), 0) > 0

    def close(self) -> None:
        """Delete the Secrets of this namespace that this process created and no pod of
        it uses any more (a deletion that failed before)."""
        namespace = self._namespace()
        with _LOCK:
            for key in [k for k in _OWNED if k[0] == namespace and not _USERS.get(k)]:
                self.delete(key[1])
                _OWNED.discard(key)

    def delete(self, name: str) -> None:
        try:
            self._api().delete_namespaced_secret(name, self._namespace())
            logger.debug("deleted Secret %s/%s", self._namespace(), name)
        except ApiException as exc:
            if exc.status != 404:
                raise
