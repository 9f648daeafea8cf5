"""Resources on the real Kubernetes test cluster: a Process's request reaches its pod
(container requests/limits, node selector, tolerations, activeDeadlineSeconds), and
an unknown extra is refused before any pod is made."""

from __future__ import annotations

import collections
import time

import pytest

import fiber
from fiber.backend import ConfigError


def _hold(seconds):
    time.sleep(seconds)


def _nap(i):
    time.sleep(0.02)
    return i


def test_process_resources_reach_the_pod(k8s_engine, admin_api):
    node = admin_api.list_node().items[0].metadata.labels["kubernetes.io/hostname"]
    p = fiber.Process(target=_hold, args=(60,), resources=fiber.Resources(
        cpu=0.25, memory="128M", walltime=600, extra={"kubernetes": {
            "node_selector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": "fiber-test", "operator": "Exists",
                             "effect": "NoSchedule"}]}}))
    p.start()
    try:
        pod = admin_api.read_namespaced_pod(p.job_id, "default")
        resources = pod.spec.containers[0].resources
        assert resources.requests == {"cpu": "250m", "memory": "128Mi"}
        assert resources.limits == {"memory": "128Mi"}
        assert pod.spec.node_selector == {"kubernetes.io/hostname": node}
        assert any(t.key == "fiber-test" and t.operator == "Exists"
                   for t in pod.spec.tolerations)
        assert pod.spec.active_deadline_seconds == 600
    finally:
        p.terminate()
        p.join(120)


def test_unknown_extra_is_refused_before_any_pod(k8s_engine, admin_api):
    def pods():
        return {p.metadata.name for p in admin_api.list_namespaced_pod(
            "default", label_selector="app.kubernetes.io/managed-by=fiber").items}

    before = pods()
    with pytest.raises(ConfigError, match=r"extra\['kubernetes'\]\['partition'\]"):
        fiber.Pool(2, resources={"extra": {"kubernetes": {"partition": "x"}}})
    assert pods() - before == set()  # no pod made (earlier ones may leave meanwhile)


def test_pool_runs_several_workers_per_pod(k8s_engine, admin_api):
    """Pool(8, workers_per_job=4): two pods, each asking for four times a worker's
    request, each running four workers the pool counts one by one."""
    with fiber.Pool(8, workers_per_job=4,
                    resources={"cpu": 0.05, "memory": "64M"}) as pool:
        assert pool.map(_nap, range(64), chunksize=1) == list(range(64))
        stats = pool.stats()
        per_pod = collections.Counter(w.process.job_id for w in stats.workers
                                      if w.state in ("idle", "busy"))
        assert sorted(per_pod.values()) == [4, 4], per_pod
        names = set(per_pod)
        for name in names:
            pod = admin_api.read_namespaced_pod(name, "default")
            resources = pod.spec.containers[0].resources
            assert resources.requests == {"cpu": "200m", "memory": "256Mi"}
