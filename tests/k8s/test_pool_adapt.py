"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real Kubernetes test cluster (up to 3: each worker a pod), issue #28: a burst
runs on both, every task once, and after the idle timeout both are back at zero with
the pods gone, checked against the API server. The time from the map to the first task
that began in a pod is printed (bench/results/adapt/first-task.md). Nothing is faked."""

from __future__ import annotations

import os
import time

import pytest
from adapt_burst import burst_and_back

from fiber.runtime.run import run_id

pytestmark = pytest.mark.timeout(300)


def where(i: int) -> tuple[int, float, str | None]:
    """The task's number, when it began, and its pod (None: not in a pod)."""
    began = time.time()
    time.sleep(0.5)
    return i, began, os.environ.get("POD_NAME")


def test_a_burst_goes_from_local_to_kubernetes_and_back(k8s_engine, admin_api):
    """local max 2, then kubernetes max 3: the map runs on both, each task once; the
    pool never holds more than each placement's maximum; after the idle timeout both
    are at zero, no pod of the run is left (the API server's list), and the next map
    runs correctly (adapt_burst.burst_and_back)."""
    run = run_id()

    def pods() -> list[str]:
        return [p.metadata.name for p in admin_api.list_pod_for_all_namespaces(
            label_selector=f"fiber.run={run}").items]

    burst_and_back("kubernetes", 3, where, lambda pod: pod is not None, pods,
                   "no pod of the run left")
