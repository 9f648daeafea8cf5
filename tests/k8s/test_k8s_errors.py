"""Bad input gets a clear error: no cluster, a cluster that refuses the user (RBAC),
invalid resource requests, no image."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from fiber.backend import ClusterUnreachableError, JobCreationError
from fiber.backend.job import JobSpec
from fiber.backend.options import ConfigError
from fiber.runtime import config
from fiber_k8s.backend import KubernetesBackend
from fiber_k8s.cluster import ForbiddenError

LABELS = {"fiber.run": "k8s-error-tests", "fiber.parent": "pytest"}


def spec(**fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", "print(1)"], labels=dict(LABELS),
                   name="error-test", **fields)


def test_no_kubeconfig(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend({"kubernetes_kubeconfig": str(tmp_path / "missing"),
                                 "image": "x:1"})
    with pytest.raises(ClusterUnreachableError, match="kubernetes_kubeconfig"):
        backend.create_job(spec())


def test_api_server_not_reachable(tmp_path):
    """A kubeconfig whose server is a closed loopback port."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "
        "'https://127.0.0.1:1', insecure-skip-tls-verify: true}\nusers:\n- name: u\n"
        "  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n"
        "current-context: x\n")
    backend = KubernetesBackend({"kubernetes_kubeconfig": str(kubeconfig), "image": "x:1"})
    try:
        with pytest.raises(ClusterUnreachableError, match="cannot reach the Kubernetes API "
                           "server at https://127.0.0.1:1"):
            backend.create_job(spec())
        with pytest.raises(ClusterUnreachableError):
            backend.list_jobs(LABELS)
    finally:
        backend.close()


def test_unknown_context(k8s_options):
    backend = KubernetesBackend({**k8s_options, "kubernetes_context": "no-such-context"})
    with pytest.raises(ClusterUnreachableError, match="no-such-context"):
        backend.create_job(spec())


def test_forbidden_by_rbac_shows_the_role(make_backend, k8s_engine, admin_api):
    """A user of the static token file with no role binding at all."""
    backend = make_backend(kubernetes_kubeconfig=k8s_engine["FK8S_TEST_NOBODY_KUBECONFIG"])
    with pytest.raises(ForbiddenError) as info:
        backend.create_job(spec())
    message = str(info.value)
    assert isinstance(info.value, JobCreationError)
    assert "403 Forbidden" in message and "fiber-nobody" in message
    assert "kind: Role" in message and "verbs: [create, get, list, watch, delete]" in message
    assert "rbac.yaml" in message
    with pytest.raises(ForbiddenError):
        backend.list_jobs(LABELS)
    assert admin_api.list_namespaced_pod(
        "default", label_selector="fiber.run=k8s-error-tests").items == []


def test_rbac_manifest_grants_enough(make_backend, k8s_engine, admin_api, tmp_path):
    """plugins/fiber-k8s/rbac.yaml, bound to the user without rights, is all it needs
    (a job with a secret included: the run's Secret is created and deleted)."""
    import yaml
    from kubernetes import client, utils

    manifest = Path(__file__).resolve().parents[2] / "plugins" / "fiber-k8s" / "rbac.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    namespace = "fiber-rbac-test"
    admin_api.create_namespace({"metadata": {"name": namespace}})
    try:
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
            if doc["kind"] == "RoleBinding":
                for subject in doc["subjects"]:
                    subject["namespace"] = namespace
                doc["subjects"].append({"kind": "User", "name": "fiber-nobody",
                                        "apiGroup": "rbac.authorization.k8s.io"})
            utils.create_from_dict(admin_api.api_client, doc, namespace=namespace)
        backend = make_backend(kubernetes_kubeconfig=k8s_engine["FK8S_TEST_NOBODY_KUBECONFIG"],
                               kubernetes_namespace=namespace)
        job = backend.create_job(spec(secrets={"FIBER_TEST_SECRET": "s"}))
        status = backend.wait(job, 90)
        assert status is not None and status.exitcode == 0, status
        assert "1" in backend.logs(job)
        assert [j.id for j in backend.list_jobs(LABELS)] == [job.id]
        managed = "app.kubernetes.io/managed-by=fiber"
        assert len(admin_api.list_namespaced_secret(namespace, label_selector=managed).items) == 1
        backend.release(job)
        assert admin_api.list_namespaced_secret(namespace, label_selector=managed).items == []
        assert backend.list_jobs(LABELS) == [] or all(
            j.id != job.id for j in backend.list_jobs(LABELS))
    finally:
        client.CoreV1Api(admin_api.api_client).delete_namespace(namespace)


@pytest.mark.parametrize("fields, needle", [
    ({"cpu": "lots"}, "invalid cpu request 'lots'"),
    ({"memory": -5}, "invalid memory request -5"),
    ({"gpu": 0.5}, "invalid gpu request 0.5"),
])
def test_invalid_resources_fail_before_submitting(make_backend, admin_api, fields, needle):
    backend = make_backend()
    with pytest.raises(JobCreationError, match=needle):
        backend.create_job(spec(**fields))
    assert admin_api.list_namespaced_pod(
        "default", label_selector="fiber.run=k8s-error-tests").items == []


def test_invalid_resource_settings_are_config_errors(monkeypatch, k8s_engine):
    monkeypatch.setenv("FIBER_KUBERNETES_RESOURCES", "ephemeral-storage=1GB")
    with pytest.raises(ConfigError, match="not a Kubernetes quantity"):
        config.load()
    monkeypatch.setenv("FIBER_KUBERNETES_RESOURCES", "ephemeral-storage=1G")
    monkeypatch.setenv("FIBER_KUBERNETES_TOLERATIONS", "gpu:Sometimes")
    with pytest.raises(ConfigError, match="Effect one of"):
        config.load()


def test_no_image_outside_a_cluster(make_backend):
    backend = make_backend(image=None)
    with pytest.raises(JobCreationError, match="FIBER_IMAGE"):
        backend.create_job(spec())
