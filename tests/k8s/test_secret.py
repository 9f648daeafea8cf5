"""The run's secret on the real Kubernetes test cluster: a fiber Process that
authenticated to its parent (it answers through a Queue) holds it, yet the pod spec
(what `kubectl get pod -o yaml` shows, read through the API) holds no value, only a
reference to the run's Secret; the Secret exists, labelled with the run, while the run
has pods, and is gone after; `fiber clean`'s path (another backend instance that
finds the jobs by label) deletes the Secret of a run whose creator did not."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import time

import pytest
from kubernetes.client.rest import ApiException

import fiber
import fiber.runtime.run
from fiber.backend.job import JobSpec
from fiber.wire import auth
from fiber_k8s.secret import secret_name


def _report(q, go):
    # the job holds the run's secret, and took it out of its environment once read (so
    # the programs its tasks start do not inherit it)
    key = ("still in the environment" if "_FIBER_AUTHKEY" in os.environ
           else auth.get_authkey().hex())
    q.put(hashlib.sha256(key.encode()).hexdigest())
    go.get()
    q.put("authenticated")


def _secret(api, name: str, namespace: str):
    try:
        return api.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _wait_gone(api, name: str, namespace: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while _secret(api, name, namespace) is not None:
        assert time.monotonic() < deadline, f"Secret {name} is still there"
        time.sleep(0.5)


def test_pod_spec_holds_no_secret_and_the_secret_goes_with_the_run(admin_api):
    key = auth.get_authkey().hex()
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=_report, args=(q, go), name="secret-holder")
    p.start()
    name = secret_name(fiber.runtime.run.run_id())
    try:
        assert q.get(timeout=300) == hashlib.sha256(key.encode()).hexdigest()
        job = p._popen.job
        namespace = job.handle
        pod = admin_api.read_namespaced_pod(job.id, namespace)
        text = json.dumps(admin_api.api_client.sanitize_for_serialization(pod))
        assert key not in text
        env = {e.name: e for e in pod.spec.containers[0].env}
        ref = env["_FIBER_AUTHKEY"].value_from.secret_key_ref
        assert env["_FIBER_AUTHKEY"].value is None and ref.name == name
        secret = _secret(admin_api, name, namespace)
        assert secret is not None
        assert secret.metadata.labels["fiber.run"] == fiber.runtime.run.run_id()
        assert base64.b64decode(secret.data[ref.key]).decode() == key
        go.put(1)
        assert q.get(timeout=60) == "authenticated"
    finally:
        p.join(120)
    assert p.exitcode == 0
    _wait_gone(admin_api, name, namespace)  # its last pod was released


@pytest.fixture
def run_labels() -> dict[str, str]:
    return {"fiber.run": "secrettest-" + os.urandom(4).hex(), "fiber.parent": "test"}


def test_fiber_clean_deletes_the_secret_a_crashed_run_left(make_backend, admin_api,
                                                           run_labels, k8s_options):
    creator, cleaner = make_backend(), make_backend()
    secret = os.urandom(32).hex()
    spec = JobSpec(command=[sys.executable, "-c", "import time; time.sleep(600)"],
                   name="secret-left", labels=run_labels, image=k8s_options.get("image"),
                   secrets={"FIBER_TEST_SECRET": secret})
    job = creator.create_job(spec)
    namespace = job.handle
    name = secret_name(run_labels["fiber.run"])
    assert _secret(admin_api, name, namespace) is not None
    pod = admin_api.read_namespaced_pod(job.id, namespace)
    assert secret not in json.dumps(admin_api.api_client.sanitize_for_serialization(pod))
    # the creator is gone without cleaning up (as a killed parent would be): what
    # `fiber clean --run RUN` does, from a process of its own
    found = cleaner.list_jobs({"fiber.run": run_labels["fiber.run"]})
    assert [j.id for j in found] == [job.id]
    for j in found:
        cleaner.terminate(j, force=True)
        assert cleaner.wait(j, 60) is not None
        cleaner.release(j)
    _wait_gone(admin_api, name, namespace, timeout=10)
