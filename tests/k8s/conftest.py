"""Fixtures of the kubernetes backend tests: they need the real test cluster, which
``pytest --fiber-backend kubernetes`` starts (tests/engines/kubernetes.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from fiber.runtime import config
from fiber_k8s.backend import KubernetesBackend


@pytest.fixture(scope="session")
def k8s_engine(fiber_engine) -> dict[str, str]:
    if fiber_engine["backend"] != "kubernetes":
        pytest.skip("needs the test cluster: run with pytest --fiber-backend kubernetes")
    return fiber_engine


@pytest.fixture
def k8s_options(k8s_engine) -> dict:
    """The effective settings (from the engine's FIBER_* environment)."""
    return config.load().as_dict()


@pytest.fixture
def make_backend(k8s_options) -> Iterator:
    """Create backends with extra settings; each is closed after the test."""
    made: list[KubernetesBackend] = []

    def make(**overrides) -> KubernetesBackend:
        backend = KubernetesBackend({**k8s_options, **overrides})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def admin_api(k8s_engine):
    """A CoreV1Api of the cluster admin (to look at the cluster behind the backend)."""
    from kubernetes import client
    from kubernetes import config as kconfig

    api_client = kconfig.new_client_from_config(os.environ["FIBER_KUBERNETES_KUBECONFIG"])
    yield client.CoreV1Api(api_client)
    api_client.close()


@pytest.fixture(scope="session", autouse=True)
def no_pods_left(fiber_engine) -> Iterator[None]:
    """After the session's kubernetes tests, no pod made by fiber may remain."""
    yield
    if fiber_engine["backend"] != "kubernetes":
        return
    from kubernetes import client
    from kubernetes import config as kconfig

    api_client = kconfig.new_client_from_config(fiber_engine["FIBER_KUBERNETES_KUBECONFIG"])
    api = client.CoreV1Api(api_client)
    deadline = time.monotonic() + 30
    while True:
        left = [f"{p.metadata.namespace}/{p.metadata.name} ({p.status.phase}"
                f"{', deleting' if p.metadata.deletion_timestamp else ''})"
                for p in api.list_pod_for_all_namespaces(
            label_selector="app.kubernetes.io/managed-by=fiber").items]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    api_client.close()
    assert not left, f"pods left on the cluster: {left}"
