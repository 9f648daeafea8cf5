"""fiber.Pool on the test cluster when a worker's pod is deleted in the middle of a
map: the pool replaces the worker and no task is lost; nothing is left afterwards."""

from __future__ import annotations

import time

import fiber


def slow_double(x: int) -> int:
    time.sleep(0.25)
    return 2 * x


def _worker_pods(api) -> list:
    pods = api.list_namespaced_pod(
        "default", label_selector="app.kubernetes.io/managed-by=fiber").items
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
            and "poolworker" in p.metadata.name]


def test_pool_survives_a_deleted_worker_pod(k8s_engine, admin_api):
    pool = fiber.Pool(3)
    try:
        assert pool.map(slow_double, range(3)) == [0, 2, 4]  # workers are up
        result = pool.map_async(slow_double, range(60), chunksize=1)
        deadline = time.monotonic() + 60
        while len(_worker_pods(admin_api)) < 3:
            assert time.monotonic() < deadline, "the pool's workers never ran"
            time.sleep(0.2)
        time.sleep(1.0)  # mid-map
        victim = _worker_pods(admin_api)[0].metadata.name
        admin_api.delete_namespaced_pod(victim, "default", grace_period_seconds=0)
        assert result.get(300) == [2 * x for x in range(60)]
        assert pool.map(slow_double, range(6)) == [2 * x for x in range(6)]
        names = {p.metadata.name for p in _worker_pods(admin_api)}
        assert victim not in names
    finally:
        pool.terminate()
        pool.join()
    deadline = time.monotonic() + 60
    while admin_api.list_namespaced_pod(
            "default", label_selector="app.kubernetes.io/managed-by=fiber").items:
        assert time.monotonic() < deadline, "pool pods left behind"
        time.sleep(0.5)
