"""Job statuses of real pods on the test cluster: OOM kills, unschedulable requests,
images that cannot be pulled, pods deleted behind fiber's back, and the watch that
feeds them."""

from __future__ import annotations

import sys
import time

import pytest

from fiber.backend.job import JobSpec, JobState

LABELS = {"fiber.run": "k8s-status-tests", "fiber.parent": "pytest"}


def spec(code: str, **fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", code], labels=dict(LABELS),
                   name=fields.pop("name", "status-test"), **fields)


def wait_state(backend, job, predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        status = backend.status(job)
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"status stayed {status}"
        time.sleep(0.2)


def test_oom_killed_job(make_backend):
    backend = make_backend()
    job = backend.create_job(spec("x = bytearray(400 * 1024 * 1024); x[::4096] = b'1' * "
                                  "len(x[::4096]); print('survived')", memory=64))
    try:
        status = backend.wait(job, 90)
        assert status is not None
        assert status.state is JobState.FAILED
        assert status.reason == "OOMKilled"
        assert status.exitcode == -9
    finally:
        backend.release(job)


@pytest.mark.parametrize("fields, needle", [
    ({"cpu": 500.0}, "Insufficient cpu"),
    ({"gpu": 1}, "Insufficient nvidia.com/gpu"),
])
def test_unschedulable_job_says_why(make_backend, fields, needle):
    backend = make_backend()
    job = backend.create_job(spec("print(1)", **fields))
    try:
        status = wait_state(backend, job, lambda s: s.reason is not None and "Unschedulable"
                            in s.reason)
        assert status.state is JobState.PENDING
        assert needle in status.reason
        assert backend.wait(job, 0.5) is None
        backend.terminate(job)
        final = backend.wait(job, 30)
        assert final is not None and final.state is JobState.CANCELLED
    finally:
        backend.release(job)


def test_node_selector_and_tolerations(make_backend):
    backend = make_backend(kubernetes_node_selector={"kubernetes.io/hostname": "fiber-node"},
                           kubernetes_tolerations=[])
    job = backend.create_job(spec("print('on the node')"))
    try:
        assert backend.wait(job, 90).state is JobState.SUCCEEDED
    finally:
        backend.release(job)
    missing = make_backend(kubernetes_node_selector={"disk": "none-has-this"})
    job = missing.create_job(spec("print(1)"))
    try:
        status = wait_state(missing, job, lambda s: s.reason is not None
                            and "node(s) didn't match" in s.reason)
        assert status.state is JobState.PENDING
    finally:
        missing.terminate(job, force=True)
        missing.release(job)


def test_image_that_cannot_be_pulled(make_backend):
    """The image lives in a registry at a closed loopback port: the pull fails
    (ErrImagePull / ImagePullBackOff) and after kubernetes_pull_timeout the job fails
    with that reason."""
    backend = make_backend(kubernetes_image_pull_policy="IfNotPresent",
                           kubernetes_pull_timeout=4.0)
    job = backend.create_job(spec("print(1)", image="127.0.0.1:1/fiber/missing:1"))
    try:
        pending = wait_state(backend, job, lambda s: s.reason is not None
                             and ("ErrImagePull" in s.reason or "ImagePullBackOff" in s.reason))
        assert pending.state is JobState.PENDING
        status = backend.wait(job, 60)
        assert status is not None and status.state is JobState.FAILED
        assert "127.0.0.1:1/fiber/missing:1" in status.reason or "Image" in status.reason
        assert "not pulled within 4s" in status.reason
    finally:
        backend.release(job)


def test_image_never_pulled_fails_at_once(make_backend):
    backend = make_backend(kubernetes_image_pull_policy="Never")
    job = backend.create_job(spec("print(1)", image="fiber-k8s/not-imported:1"))
    try:
        status = backend.wait(job, 60)
        assert status is not None and status.state is JobState.FAILED
        assert status.reason.startswith("ErrImageNeverPull")
    finally:
        backend.release(job)


def test_terminate_before_the_container_starts_ends_the_job_at_once(make_backend, admin_api):
    """terminate() of a pod still being created deletes it without a grace period: the
    job is cancelled (-SIGTERM, as multiprocessing reports terminate()) within seconds
    and its pod is gone from the API (the 1.20 kubelet can otherwise keep a pod deleted
    mid-creation for minutes)."""
    from kubernetes.client.rest import ApiException

    backend = make_backend()
    job = backend.create_job(spec("import time; time.sleep(300)"))
    try:
        began = time.monotonic()
        backend.terminate(job)
        status = backend.wait(job, 30)
        assert status is not None and status.state is JobState.CANCELLED
        assert status.exitcode == -15
        assert time.monotonic() - began < 15
        deadline = time.monotonic() + 15
        while True:
            try:
                admin_api.read_namespaced_pod(job.id, "default")
            except ApiException as exc:
                assert exc.status == 404
                break
            assert time.monotonic() < deadline, f"pod {job.id} still exists"
            time.sleep(0.2)
    finally:
        backend.release(job)


def test_pod_deleted_on_the_cluster_is_cancelled(make_backend, admin_api):
    backend = make_backend()
    job = backend.create_job(spec("import time; time.sleep(300)"))
    try:
        wait_state(backend, job, lambda s: s.state is JobState.RUNNING, 90)
        admin_api.delete_namespaced_pod(job.id, "default", grace_period_seconds=1)
        status = backend.wait(job, 60)
        assert status is not None and status.state is JobState.CANCELLED
    finally:
        backend.release(job)


def test_status_comes_from_one_watch(make_backend):
    """Many jobs, one watch thread; statuses change without per-pod reads."""
    import threading

    backend = make_backend()
    before = set(threading.enumerate())
    jobs = [backend.create_job(spec(f"import sys; sys.exit({i})")) for i in range(3)]
    try:
        new = [t for t in threading.enumerate() if t not in before]
        assert [t.name for t in new] == ["fiber-k8s-watch"]
        calls = []
        original = backend.conn.api.read_namespaced_pod
        backend.conn.api.read_namespaced_pod = lambda *a, **k: calls.append(a) or original(*a, **k)
        statuses = [backend.wait(job, 90) for job in jobs]
        assert [s.exitcode for s in statuses] == [0, 1, 2]
        assert calls == []
    finally:
        for job in jobs:
            backend.release(job)
    backend.close()
    assert not new[0].is_alive()


def test_cpu_memory_requests_reach_the_pod(make_backend, admin_api):
    backend = make_backend(kubernetes_resources={"ephemeral-storage": "10Mi"})
    job = backend.create_job(spec("print(1)", cpu=0.25, memory=300))
    try:
        pod = admin_api.read_namespaced_pod(job.id, "default")
        resources = pod.spec.containers[0].resources
        assert resources.requests == {"cpu": "250m", "memory": "300Mi",
                                      "ephemeral-storage": "10Mi"}
        assert resources.limits == {"memory": "300Mi"}
        assert backend.wait(job, 90).state is JobState.SUCCEEDED
    finally:
        backend.release(job)


def test_child_listens_on_its_own_address(make_backend, k8s_engine):
    """A job inherits its parent's kubernetes_listen_address (the host end of the test
    network); inside its pod the backend must use the pod's address instead."""
    backend = make_backend()
    host_ip = k8s_engine["FIBER_KUBERNETES_LISTEN_ADDRESS"]
    job = backend.create_job(spec(
        "from fiber.runtime import config; from fiber_k8s.backend import KubernetesBackend; "
        "print('listen=' + KubernetesBackend(config.load().as_dict()).listen_address())",
        env={"FIBER_KUBERNETES_LISTEN_ADDRESS": host_ip,
             "FIBER_KUBERNETES_HOST_NETWORK": "true"}))
    try:
        status = backend.wait(job, 90)
        logs = backend.logs(job)
        assert status.exitcode == 0, logs
        assert f"listen={k8s_engine['FK8S_TEST_NODE_IP']}\n" in logs
        assert backend.listen_address() == host_ip
    finally:
        backend.release(job)
