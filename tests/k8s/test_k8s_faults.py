"""Faults injected into the real Kubernetes test cluster cost time, never results (#17).

The cluster's kube-apiserver is frozen (SIGSTOP, by the pid start.sh recorded:
tests/engines/kubernetes.py) for 10 s in the middle of a 5,000-task map (driven by
tests/fault_map.py) while the pool's worker processes (found on this host by
their run id in their environment) are SIGKILLed, some during the outage: a worker
lost then must be replaced by a pod the frozen API server cannot create until it is
thawed (SIGCONT). Every result arrives exactly once and executions are counted (each
finished task puts its number on a fiber Queue of the test).
"""

from __future__ import annotations

import collections
import functools
import time

import fault_map
from engines import kubernetes as kubernetes_engine

import fiber
import fiber.runtime.run


def record(done, i: int) -> int:
    time.sleep(0.01)
    done.put(i)
    return i * i


def test_api_server_outage_and_killed_workers_lose_nothing(k8s_engine):
    done = fiber.Queue()
    n = 5000
    run = fiber.runtime.run.run_id()
    try:
        with fiber.Pool(4) as pool:
            pool.map(abs, range(8))  # the workers are up
            candidates = fault_map.job_processes(run)
            assert len(candidates) >= 4, candidates
            result, faults = fault_map.map_under_faults(
                pool, functools.partial(record, done), n,
                victims=lambda killed: [p for p in candidates if p not in killed][:1],
                kills=2, every=2.0, freeze=kubernetes_engine.freeze,
                thaw=kubernetes_engine.thaw, outage_after=1.0, outage_seconds=10.0)
    finally:
        kubernetes_engine.thaw()  # never leave the API server frozen
    runs = collections.Counter(done.get(timeout=30) for _ in range(done.qsize()))
    fault_map.check_exactly_once(result, n, runs, faults)
