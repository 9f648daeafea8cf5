"""Faults injected into the real Docker test engine cost time, never results (#17).

The engine's dockerd is frozen (SIGSTOP, by the pid in its pidfile:
tests/engines/docker.py) for 10 s in the middle of a 5,000-task map (driven by
tests/fault_map.py) while the pool's worker containers are SIGKILLed at random (by their
host pid, read from ``docker inspect`` before the outage): a worker killed during the
outage must be replaced by a container that the frozen daemon cannot create until it
is thawed (SIGCONT). Every result arrives exactly once, executions are counted (each
finished task puts its number on a fiber Queue of the test), and no container of the
run is left afterwards. A second test restarts dockerd in the middle of a map (every
worker container stops with it, and its socket refuses connections for 5 s).
"""

from __future__ import annotations

import collections
import functools
import time

import fault_map
from engines import docker as docker_engine

import fiber
import fiber.runtime.run


def record(done, i: int) -> int:
    """A task of 10 ms that records its execution once it is complete."""
    time.sleep(0.01)
    done.put(i)
    return i * i


def _worker_host_pids(engine_client) -> list[int]:
    rows = engine_client.api.containers(filters={
        "label": f"fiber.run={fiber.runtime.run.run_id()}", "status": "running"})
    pids = []
    for row in rows:
        if "poolworker" in row["Labels"].get("fiber.name", ""):
            pid = engine_client.api.inspect_container(row["Id"])["State"]["Pid"]
            if pid:
                pids.append(pid)
    return pids


def test_daemon_outage_and_killed_workers_lose_nothing(engine_client):
    done = fiber.Queue()
    n = 5000
    try:
        with fiber.Pool(4) as pool:
            pool.map(abs, range(8))  # the workers are up
            candidates = _worker_host_pids(engine_client)
            assert len(candidates) == 4, candidates
            result, faults = fault_map.map_under_faults(
                pool, functools.partial(record, done), n,
                victims=lambda killed: [p for p in candidates if p not in killed],
                kills=3, every=1.5, seed=29, freeze=docker_engine.freeze,
                thaw=docker_engine.thaw, outage_after=1.0, outage_seconds=10.0)
    finally:
        docker_engine.thaw()  # never leave the daemon frozen
    runs = collections.Counter(done.get(timeout=30) for _ in range(done.qsize()))
    fault_map.check_exactly_once(result, n, runs, faults)
    run = fiber.runtime.run.run_id()
    deadline = time.monotonic() + 60
    while engine_client.api.containers(all=True, filters={"label": f"fiber.run={run}"}):
        assert time.monotonic() < deadline, "containers of the run are left"
        time.sleep(0.2)


def test_daemon_restart_loses_nothing(engine_client):
    """dockerd restarted in the middle of a 3,000-task map (scripts/engines/docker:
    restart): it stops every worker container as it goes down, refuses connections
    for 5 s, then comes back. The pool rides out the refused connections (transient),
    replaces every worker once the daemon answers, and every result arrives exactly
    once, each lost worker re-running at most its task in progress."""
    done = fiber.Queue()
    n = 3000
    with fiber.Pool(4) as pool:
        pool.map(abs, range(8))  # the workers are up
        before = set(_worker_host_pids(engine_client))
        assert len(before) == 4, before
        pending = pool.map_async(functools.partial(record, done), range(n),
                                 chunksize=1)
        time.sleep(1.0)
        started = time.monotonic()
        docker_engine.restart(down_seconds=5.0)
        result = pending.get(300)
        took = time.monotonic() - started
        stats = pool.stats()
        assert pool.map(abs, range(-8, 0)) == list(range(8, 0, -1))  # still whole
        after = set(_worker_host_pids(engine_client))
    runs = collections.Counter(done.get(timeout=30) for _ in range(done.qsize()))
    assert result == [i * i for i in range(n)]
    assert set(runs) == set(range(n))
    duplicates = sum(c - 1 for c in runs.values())
    # the restart stopped all four workers; each re-runs at most its task in progress
    assert stats.lost >= 4, stats
    assert duplicates <= stats.lost, (duplicates, stats.lost)
    assert after and not after & before, (before, after)
    print(f"map of {n} tasks across a dockerd restart (5 s down): {took:.1f} s after "
          f"the restart began, {stats.lost} workers lost, {duplicates} duplicates")
    run = fiber.runtime.run.run_id()
    deadline = time.monotonic() + 60
    while engine_client.api.containers(all=True, filters={"label": f"fiber.run={run}"}):
        assert time.monotonic() < deadline, "containers of the run are left"
        time.sleep(0.2)
