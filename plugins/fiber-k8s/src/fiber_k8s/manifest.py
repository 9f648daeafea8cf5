"""The pod manifest of a job: container, resources, labels, scheduling and volumes
from the job spec and the ``kubernetes_*`` settings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fiber.backend import JobSpec
from fiber_k8s import names
from fiber_k8s.resources import pod_resources
from fiber_k8s.settings import (
    parse_host_paths,
    parse_key_values,
    parse_tolerations,
    parse_volumes,
)
from fiber_k8s.status import CONTAINER

INSTANCE_LABEL = "fiber.k8s/instance"
MANAGED_BY = {"app.kubernetes.io/managed-by": "fiber"}
ANNOTATION_NAME = "fiber.job/name"
ANNOTATION_LABELS = "fiber.job/labels"


def _downward(name: str, field_path: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def pod_manifest(spec: JobSpec, *, pod_name: str, namespace: str, image: str,
                 instance: str, options: Mapping[str, Any],
                 owner: dict | None = None, secret_name: str | None = None) -> dict:
    """The pod (as a plain dict for the API) that runs ``spec``; ``spec.secrets``
    become environment variables taken from the Secret ``secret_name`` (the pod spec
    names the Secret and its keys, never a value)."""
    labels = names.labels({**parse_key_values(options.get("kubernetes_labels") or []),
                           **spec.labels})
    labels.update(MANAGED_BY)
    labels[INSTANCE_LABEL] = instance
    env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in spec.env.items()]
    # the job's own requests (Resources.extra["kubernetes"]) on top of the settings
    extra: Mapping[str, Any] = getattr(spec, "extra", None) or {}
    if spec.secrets:
        if not secret_name:
            raise ValueError("a job with secrets needs the Secret that holds them")
        env.extend({"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}}
                   for k in spec.secrets)
    given = set(spec.env) | set(spec.secrets)
    for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                       ("POD_IP", "status.podIP")):
        if name not in given:
            env.append(_downward(name, path))
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "command": list(spec.command),
        "env": env,
        "resources": pod_resources(spec.cpu, spec.memory, spec.gpu, {
            **parse_key_values(options.get("kubernetes_resources") or {}),
            **parse_key_values(extra.get("resources") or {})}),
    }
    if spec.cwd:
        container["workingDir"] = spec.cwd
    if options.get("kubernetes_image_pull_policy"):
        container["imagePullPolicy"] = options["kubernetes_image_pull_policy"]
    volumes, mounts = [], []
    for i, mount in enumerate(parse_volumes(options.get("kubernetes_volumes") or [])):
        volumes.append({"name": f"pvc-{i}",
                        "persistentVolumeClaim": {"claimName": mount.source,
                                                  "readOnly": mount.read_only}})
        mounts.append({"name": f"pvc-{i}", "mountPath": mount.path, "readOnly": mount.read_only})
    for i, mount in enumerate(parse_host_paths(options.get("kubernetes_host_paths") or [])):
        volumes.append({"name": f"host-{i}", "hostPath": {"path": mount.source}})
        mounts.append({"name": f"host-{i}", "mountPath": mount.path, "readOnly": mount.read_only})
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": max(1, round(options.get("kubernetes_grace_period")
                                                      or 3)),
    }
    if options.get("kubernetes_host_pid"):
        pod_spec["hostPID"] = True
    else:
        # the pod's pause process is PID 1, so the job's Python gets the default signal
        # behaviour (PID 1 ignores SIGTERM and SIGKILL sent from inside its namespace)
        pod_spec["shareProcessNamespace"] = True
    if volumes:
        pod_spec["volumes"] = volumes
    selector = {**parse_key_values(options.get("kubernetes_node_selector") or {}),
                **parse_key_values(extra.get("node_selector") or {})}
    if selector:
        pod_spec["nodeSelector"] = selector
    tolerations = [t.manifest() for t in
                   parse_tolerations(options.get("kubernetes_tolerations") or "")]
    job_tolerations: Any = extra.get("tolerations") or []
    if isinstance(job_tolerations, str):
        tolerations += [t.manifest() for t in parse_tolerations(job_tolerations)]
    else:
        tolerations += [dict(t) for t in job_tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if extra.get("priority_class_name"):
        pod_spec["priorityClassName"] = str(extra["priority_class_name"])
    if spec.walltime:  # the pod is ended (DeadlineExceeded) after that long
        pod_spec["activeDeadlineSeconds"] = int(spec.walltime)
    if options.get("kubernetes_service_account"):
        pod_spec["serviceAccountName"] = options["kubernetes_service_account"]
    if options.get("kubernetes_host_network"):
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    metadata: dict[str, Any] = {
        "name": pod_name,
        "namespace": namespace,
        "labels": labels,
        "annotations": {ANNOTATION_NAME: spec.name,
                        ANNOTATION_LABELS: json.dumps(spec.labels, sort_keys=True)},
    }
    if owner:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
