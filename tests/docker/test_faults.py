"""Faults injected into the real Docker test engine cost time, never results (#17).

The engine's dockerd is frozen (SIGSTOP, by the pid in its pidfile) for 10 s in the
middle of a map while the pool's worker containers are SIGKILLed at random (by their
host pid, read from ``docker inspect`` before the outage): a worker killed during the
outage must be replaced by a container that the frozen daemon cannot create until it
is thawed (SIGCONT). Every result arrives exactly once, executions are counted (each
finished task puts its number on a fiber Queue of the test), and no container of the
run is left afterwards.
"""

from __future__ import annotations

import collections
import functools
import os
import random
import signal
import threading
import time
from pathlib import Path

import fiber
import fiber.runtime.run


def record(done, i: int) -> int:
    """A task of 10 ms that records its execution once it is complete."""
    time.sleep(0.01)
    done.put(i)
    return i * i


def _dockerd_pid() -> int:
    socket = os.environ["FIBER_DOCKER_HOST"].removeprefix("unix://")
    return int((Path(socket).parent / "docker.pid").read_text())


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
    dockerd = _dockerd_pid()
    kills: list[int] = []
    killed_in_outage: list[int] = []
    outage = threading.Event()
    stop = threading.Event()
    thawed: list[float] = []
    try:
        with fiber.Pool(4) as pool:
            pool.map(abs, range(8))  # the workers are up
            candidates = _worker_host_pids(engine_client)
            assert len(candidates) == 4, candidates

            def killer() -> None:
                rnd = random.Random(29)
                while len(kills) < 3 and not stop.wait(1.5):
                    live = [pid for pid in candidates if pid not in kills]
                    pid = rnd.choice(live)
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                    if outage.is_set():
                        killed_in_outage.append(pid)

            def freezer() -> None:
                if stop.wait(1.0):
                    return
                os.kill(dockerd, signal.SIGSTOP)
                outage.set()
                try:
                    stop.wait(10.0)
                finally:
                    os.kill(dockerd, signal.SIGCONT)
                    outage.clear()
                    thawed.append(time.monotonic())

            threads = [threading.Thread(target=killer), threading.Thread(target=freezer)]
            for thread in threads:
                thread.start()
            try:
                result = pool.map(functools.partial(record, done), range(n),
                                  chunksize=1)
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
    finally:
        os.kill(dockerd, signal.SIGCONT)  # never leave the daemon frozen
    assert result == [i * i for i in range(n)]
    assert thawed, "the map ended before the outage"
    assert kills and killed_in_outage, (kills, killed_in_outage)
    runs = collections.Counter(done.get(timeout=30) for _ in range(done.qsize()))
    assert set(runs) == set(range(n))
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= len(kills), duplicates
    run = fiber.runtime.run.run_id()
    deadline = time.monotonic() + 60
    while engine_client.api.containers(all=True, filters={"label": f"fiber.run={run}"}):
        assert time.monotonic() < deadline, "containers of the run are left"
        time.sleep(0.2)
