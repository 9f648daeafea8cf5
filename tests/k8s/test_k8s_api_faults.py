"""The Kubernetes rows of docs/backend-errors.md, against the test cluster's real
kube-apiserver through a fault proxy in front of it (tests/k8s/fault_proxy.py: it
forwards every request, and answers the next N pod creations with a fault when told).

- 429 Too Many Requests (with Retry-After), 503, a reset connection and a stalled
  request (no answer: ``kubernetes_request_timeout`` at 1 s) are transient: fiber
  retries the pod's creation and the process, or the pool, runs;
- 400, 401, 403, 404, 409 and 422 are permanent: ``Process.start`` fails at once
  (well inside the retry budget) with the server's message; 401 and 403 also from the
  real server (a token it does not know, and a user without rights).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import fault_proxy
import pytest

import fiber
from fiber.backend import BackendError, registry

PODS = "/pods"  # the path fragment of pod creation (POST .../namespaces/NS/pods)
BUDGET = 30  # the retry budget of these tests; "at once" is well inside it


def triple(x: int) -> int:
    return 3 * x


@pytest.fixture
def proxy(k8s_engine, admin_api) -> Iterator[fault_proxy.FaultProxy]:
    """The proxy; it stays up until fiber has asked to delete the test's pods (which
    it does through the proxy once the cluster reports a job ended)."""
    started = fault_proxy.start_in_front_of(os.environ["FIBER_KUBERNETES_KUBECONFIG"])
    yield started
    began = time.monotonic()
    while left := [p.metadata.name for p in admin_api.list_namespaced_pod(
            "default", label_selector="app.kubernetes.io/managed-by=fiber").items
            if not p.metadata.deletion_timestamp]:
        if time.monotonic() > began + 30:
            print(f"pods not deleted 30 s after the test: {left}")  # no_pods_left names them
            break
        time.sleep(0.2)
    started.close()


@pytest.fixture
def through(proxy, tmp_path):
    """``through(**settings)``: a fiber context of the kubernetes backend whose API
    calls go through the proxy (as the admin user, unless ``kubeconfig`` says)."""

    def context(kubeconfig: str | None = None, **settings):
        path = fault_proxy.kubeconfig_through(
            proxy, kubeconfig or os.environ["FIBER_KUBERNETES_KUBECONFIG"], tmp_path)
        return fiber.get_context("kubernetes", kubernetes_kubeconfig=path,
                                 backend_retry_timeout=BUDGET, **settings)

    yield context
    # the contexts' backend instances are closed while the proxy is up: they delete
    # their pods and the run's Secret through it, and their watchers stop (left open,
    # an instance kept owning the run's Secret, so a later test's instance could not
    # delete it, and its watcher polled the closed proxy for the rest of the session)
    registry.reset_instances()


def _run(ctx) -> float:
    """Start a process in ``ctx``, wait for it; return how long its start took."""
    began = time.monotonic()
    process = ctx.Process(target=triple, args=(2,))
    process.start()
    started = time.monotonic() - began
    process.join(120)
    assert process.exitcode == 0, process.exitcode
    return started


@pytest.mark.parametrize("fault", [429, 500, 503, "reset", "stall"])
def test_transient_answers_are_retried(through, proxy, fault):
    ctx = through(kubernetes_request_timeout=1)
    proxy.inject(fault, count=2, verb="POST", path=PODS, stall=5.0)
    _run(ctx)
    assert [f for f, _, _ in proxy.served] == [fault, fault]
    assert proxy.forwarded > 0


def test_too_many_requests_honours_retry_after(through, proxy):
    """Two 429s saying "Retry-After: 2": the third try comes no sooner than 4 s after
    the first (fiber's own backoff alone would have tried again within 0.75 s)."""
    ctx = through()
    proxy.inject(429, count=2, verb="POST", path=PODS, retry_after=2)
    started = _run(ctx)
    assert started >= 4.0, started
    assert len(proxy.served) == 2


def test_a_pool_rides_out_too_many_requests(through, proxy):
    ctx = through()
    proxy.inject(429, count=3, verb="POST", path=PODS, retry_after=1)
    with ctx.Pool(2) as pool:
        assert pool.map(triple, range(10)) == [3 * x for x in range(10)]
    assert len(proxy.served) == 3


@pytest.mark.parametrize("code", [400, 401, 403, 404, 409, 422])
def test_refusals_fail_at_once_with_the_servers_message(through, proxy, code):
    ctx = through()
    message = f"the server says no ({code})"
    proxy.inject(code, count=100, verb="POST", path=PODS, message=message)
    began = time.monotonic()
    with pytest.raises(BackendError) as caught:
        ctx.Process(target=triple, args=(2,)).start()
    elapsed = time.monotonic() - began
    assert elapsed < 5, f"failed after {elapsed:.1f} s"
    assert caught.value.transient is False
    assert message in str(caught.value), str(caught.value)
    assert len(proxy.served) == 1  # asked once, not again


def test_unknown_token_fails_at_once(through, proxy, tmp_path):
    """A real 401 of the real API server (through the proxy, which forwards it)."""
    import yaml

    loaded = yaml.safe_load(open(os.environ["FIBER_KUBERNETES_KUBECONFIG"]).read())
    for user in loaded["users"]:
        user["user"] = {"token": "not-a-token-the-server-knows"}
    bad = tmp_path / "bad-token.kubeconfig"
    bad.write_text(yaml.safe_dump(loaded))
    ctx = through(kubeconfig=str(bad))
    began = time.monotonic()
    with pytest.raises(BackendError, match="401 Unauthorized: Unauthorized") as caught:
        ctx.Process(target=triple, args=(2,)).start()
    assert time.monotonic() - began < 5
    assert caught.value.transient is False


def test_forbidden_user_fails_at_once(through, proxy, k8s_engine):
    """A real 403 of the real API server: a user without any role."""
    ctx = through(kubeconfig=k8s_engine["FK8S_TEST_NOBODY_KUBECONFIG"])
    began = time.monotonic()
    with pytest.raises(BackendError, match="403 Forbidden.*fiber-nobody") as caught:
        ctx.Process(target=triple, args=(2,)).start()
    assert time.monotonic() - began < 5
    assert caught.value.transient is False


def test_a_watcher_stopped_while_its_watch_request_is_under_way_ends_at_once(proxy, tmp_path):
    """The pod watcher is stopped while its watch request is held by the server (the
    proxy holds it 2 s, then forwards it): stop() returns once the answer arrives, not
    after its 10 s join bound while the watch streams on (every backend closed right
    after its first pod was refused took 10 s to close: the refusal tests' teardown)."""
    import kubernetes

    from fiber_k8s.watcher import PodWatcher

    path = fault_proxy.kubeconfig_through(
        proxy, os.environ["FIBER_KUBERNETES_KUBECONFIG"], tmp_path)
    client = kubernetes.config.new_client_from_config(config_file=path)
    try:
        watcher = PodWatcher(kubernetes.client.CoreV1Api(client), "default",
                             "app.kubernetes.io/managed-by=fiber")
        proxy.inject("late", count=1, verb="GET", path="watch=", stall=2.0)
        before = set(threading.enumerate())
        watcher.start()
        (thread,) = [t for t in threading.enumerate()
                     if t.name == "fiber-k8s-watch" and t not in before]
        deadline = time.monotonic() + 30
        while not proxy.served:  # the watch request reached the proxy, held there
            assert time.monotonic() < deadline, "no watch request came"
            time.sleep(0.05)
        began = time.monotonic()
        watcher.stop()
        took = time.monotonic() - began
        assert watcher.synced.is_set()  # it had listed the pods first
        assert took < 6, f"stop() took {took:.1f} s"
        assert not thread.is_alive()
    finally:
        client.close()
