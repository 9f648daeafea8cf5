"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real Kubernetes test cluster (up to 3: each worker a pod), issue #28: a burst
runs on both, every task once, and after the idle timeout both are back at zero with
the pods gone, checked against the API server. The time from the map to the first task
that began in a pod is printed (bench/results/adapt/first-task.md). Nothing is faked."""

from __future__ import annotations

import os
import time

import pytest

import fiber
from fiber.runtime.run import run_id

pytestmark = pytest.mark.timeout(300)


def where(i: int) -> tuple[int, float, str | None]:
    """The task's number, when it began, and its pod (None: not in a pod)."""
    began = time.time()
    time.sleep(0.5)
    return i, began, os.environ.get("POD_NAME")


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def held(pool) -> list[int]:
    return [p.busy + p.idle + p.starting + p.pending
            for p in pool.stats().adapt.placements]


def test_a_burst_goes_from_local_to_kubernetes_and_back(k8s_engine, admin_api):
    """local max 2, then kubernetes max 3: the map runs on both, each task once; the
    pool never holds more than each placement's maximum; after the idle timeout both
    are at zero, no pod of the run is left (the API server's list), and the next map
    runs correctly."""
    run = run_id()

    def pods() -> list[str]:
        return [p.metadata.name for p in admin_api.list_pod_for_all_namespaces(
            label_selector=f"fiber.run={run}").items]

    local, k8s = fiber.get_context("local"), fiber.get_context("kubernetes")
    pool = fiber.Pool(1, context=local)
    n = 80
    try:
        pool.adapt(0, placements=[(local, 2), (k8s, 3)], idle_timeout=2.0)
        started = time.time()
        result = pool.map_async(where, range(n), chunksize=1)
        most = [0, 0]
        while not result.ready():
            counts = held(pool)
            most = [max(m, c) for m, c in zip(most, counts, strict=True)]
            time.sleep(0.1)
        out = result.get()
        took = time.time() - started
        assert [i for i, _, _ in out] == list(range(n))
        assert most[0] <= 2 and most[1] <= 3, most
        in_pods = [began for _, began, pod in out if pod is not None]
        on_local = [began for _, began, pod in out if pod is None]
        assert in_pods and on_local, (len(in_pods), len(on_local))
        first = min(in_pods) - started
        print(f"adaptive pool local 2 + kubernetes 3, {n} tasks of 0.5 s: {took:.1f} s; "
              f"{len(in_pods)} in pods; first task in a pod {first:.2f} s after the map")
        wait_for(lambda: held(pool) == [0, 0], 60, "both placements at zero")
        wait_for(lambda: not pods(), 60, "no pod of the run left")
        assert pool.map(abs, range(-3, 3)) == [3, 2, 1, 0, 1, 2]
    finally:
        pool.terminate()
        pool.join()
    wait_for(lambda: not pods(), 90, "no pod of the run left")
