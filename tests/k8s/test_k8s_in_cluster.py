"""A parent running inside a pod (created with generateName, in a non-default
namespace, with the service account of plugins/fiber-k8s/rbac.yaml): the backend uses
the in-cluster configuration, finds its own pod, runs the child in the parent pod's
image and namespace, and makes the parent pod the child's owner and the owner of the
run's Secret, from which the child gets its secret (deleted with the child)."""

from __future__ import annotations

import ipaddress
import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import utils

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "fiber-in-cluster"

PARENT = """
import json, sys
from fiber.runtime import config
from fiber.backend.job import JobSpec
from fiber_k8s.backend import KubernetesBackend

backend = KubernetesBackend(config.load().as_dict())
from fiber_k8s.secret import secret_name

code = "import os; print('child ok', os.environ.get('FIBER_TEST_SECRET') == 'k8s-secret')"
job = backend.create_job(JobSpec(command=[sys.executable, "-c", code],
                                 labels={"fiber.run": "in-cluster", "fiber.parent": "p"},
                                 name="child", secrets={"FIBER_TEST_SECRET": "k8s-secret"}))
status = backend.wait(job, 90)
pod = backend.conn.api.read_namespaced_pod(job.id, backend.conn.namespace)
secret = backend.conn.api.read_namespaced_secret(secret_name("in-cluster"),
                                                 backend.conn.namespace)
result = {
    "namespace": backend.conn.namespace, "in_cluster": backend.conn.in_cluster,
    "image": pod.spec.containers[0].image,
    "owners": [o.name for o in pod.metadata.owner_references or []],
    "secret_owners": [o.name for o in secret.metadata.owner_references or []],
    "exitcode": status.exitcode, "logs": backend.logs(job),
    "listen": backend.listen_address()}
backend.release(job)
print("RESULT " + json.dumps(result), flush=True)
backend.close()
"""


def _setup_namespace(api) -> None:
    api.create_namespace({"metadata": {"name": NAMESPACE}})
    for doc in yaml.safe_load_all((ROOT / "plugins" / "fiber-k8s" / "rbac.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"]["namespace"] = NAMESPACE
        for subject in doc.get("subjects", []):
            subject["namespace"] = NAMESPACE
        utils.create_from_dict(api.api_client, doc, namespace=NAMESPACE)
    deadline = time.monotonic() + 60
    while not api.read_namespaced_service_account("fiber", NAMESPACE).secrets:
        assert time.monotonic() < deadline, "the service account never got its token"
        time.sleep(0.3)


def _parent_pod(engine: dict, image: str, host_network: bool) -> dict:
    """With hostNetwork the pod's hostname is the node's, so the pod learns its name
    from the downward API ($POD_NAME); on the pod network it relies on $HOSTNAME."""
    env = {
        "KUBERNETES_SERVICE_HOST": engine["FK8S_TEST_NODE_IP"],
        "KUBERNETES_SERVICE_PORT": "6443",
        "FIBER_KUBERNETES_HOST_NETWORK": "true" if host_network else "false",
        "FIBER_KUBERNETES_HOST_PATHS": f"{ROOT}:ro",
        "FIBER_KUBERNETES_IMAGE_PULL_POLICY": "Never",
    }
    downward = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "fiber-parent-", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never", "serviceAccountName": "fiber",
            "hostNetwork": host_network,
            "containers": [{
                "name": "parent", "image": image, "imagePullPolicy": "Never",
                "command": [sys.executable, "-c", PARENT], "workingDir": str(ROOT),
                "env": [{"name": k, "value": v} for k, v in env.items()]
                + (downward if host_network else []),
                "volumeMounts": [{"name": "src", "mountPath": str(ROOT), "readOnly": True}],
            }],
            "volumes": [{"name": "src", "hostPath": {"path": str(ROOT)}}],
        },
    }


@pytest.mark.parametrize("host_network", [True, False], ids=["hostNetwork", "pod-network"])
def test_parent_in_a_pod(k8s_engine, admin_api, host_network):
    image = k8s_engine["FIBER_IMAGE"]
    _setup_namespace(admin_api)
    try:
        parent = admin_api.create_namespaced_pod(
            NAMESPACE, _parent_pod(k8s_engine, image, host_network))
        name = parent.metadata.name
        assert name.startswith("fiber-parent-") and name != "fiber-parent-"
        deadline = time.monotonic() + 150
        while admin_api.read_namespaced_pod(name, NAMESPACE).status.phase not in (
                "Succeeded", "Failed"):
            assert time.monotonic() < deadline, "the parent pod did not finish"
            time.sleep(0.5)
        logs = admin_api.read_namespaced_pod_log(name, NAMESPACE)
        lines = [line for line in logs.splitlines() if line.startswith("RESULT ")]
        assert lines, logs
        result = json.loads(lines[-1][len("RESULT "):])
        assert result["in_cluster"] is True
        assert result["namespace"] == NAMESPACE
        assert result["image"] == image
        assert result["owners"] == [name]
        assert result["secret_owners"] == [name]  # the run's Secret goes with the parent pod
        assert result["exitcode"] == 0
        assert "child ok True" in result["logs"]  # it got the secret from the Secret
        assert admin_api.list_namespaced_secret(  # deleted with the run's last pod
            NAMESPACE, label_selector="fiber.run=in-cluster").items == []
        pod_ip = admin_api.read_namespaced_pod(name, NAMESPACE).status.pod_ip
        assert result["listen"] == pod_ip
        if host_network:
            assert pod_ip == k8s_engine["FK8S_TEST_NODE_IP"]
        else:
            assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(
                k8s_engine["FK8S_TEST_POD_CIDR"])
        assert admin_api.list_namespaced_pod(
            NAMESPACE, label_selector="fiber.run=in-cluster").items == []
    finally:
        for pod in admin_api.list_namespaced_pod(NAMESPACE).items:
            admin_api.delete_namespaced_pod(pod.metadata.name, NAMESPACE, grace_period_seconds=0)
        admin_api.delete_namespace(NAMESPACE)
        deadline = time.monotonic() + 90
        while NAMESPACE in {n.metadata.name for n in admin_api.list_namespace().items}:
            assert time.monotonic() < deadline, "namespace not deleted"
            time.sleep(0.5)
