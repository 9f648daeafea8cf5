"""Faults injected into the real Kubernetes test cluster cost time, never results (#17).

The cluster's kube-apiserver is frozen (SIGSTOP, by the pid start.sh recorded) for
10 s in the middle of a map while the pool's worker processes (found on this host by
their run id in their environment) are SIGKILLed, some during the outage: a worker
lost then must be replaced by a pod the frozen API server cannot create until it is
thawed (SIGCONT). Every result arrives exactly once and executions are counted (each
finished task puts its number on a fiber Queue of the test).
"""

from __future__ import annotations

import collections
import functools
import os
import signal
import threading
import time
from pathlib import Path

import fiber
import fiber.runtime.run


def record(done, i: int) -> int:
    time.sleep(0.01)
    done.put(i)
    return i * i


def _apiserver_pid() -> int:
    state = Path(os.environ["FK8S_TEST_STATE"])
    return int((state / "pids" / "apiserver").read_text().split()[0])


def _worker_pids(run: str) -> list[int]:
    """Host pids of this run's job processes (the pool's workers: the test's only
    jobs while it runs)."""
    marker = f"_FIBER_RUN={run}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and b"fiber.runtime.bootstrap" in cmdline:
            pids.append(int(entry))
    return pids


def test_api_server_outage_and_killed_workers_lose_nothing(k8s_engine):
    done = fiber.Queue()
    n = 5000
    run = fiber.runtime.run.run_id()
    apiserver = _apiserver_pid()
    kills: list[int] = []
    killed_in_outage: list[int] = []
    outage = threading.Event()
    stop = threading.Event()
    thawed: list[float] = []
    try:
        with fiber.Pool(4) as pool:
            pool.map(abs, range(8))  # the workers are up
            candidates = _worker_pids(run)
            assert len(candidates) >= 4, candidates

            def killer() -> None:
                while len(kills) < 2 and not stop.wait(2.0):
                    pid = candidates[len(kills)]
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                    if outage.is_set():
                        killed_in_outage.append(pid)

            def freezer() -> None:
                if stop.wait(1.0):
                    return
                os.kill(apiserver, signal.SIGSTOP)
                outage.set()
                try:
                    stop.wait(10.0)
                finally:
                    os.kill(apiserver, signal.SIGCONT)
                    outage.clear()
                    thawed.append(time.monotonic())

            threads = [threading.Thread(target=killer), threading.Thread(target=freezer)]
            for thread in threads:
                thread.start()
            try:
                result = pool.map(functools.partial(record, done), range(n), chunksize=1)
            finally:
                stop.set()
                for thread in threads:
                    thread.join()
    finally:
        os.kill(apiserver, signal.SIGCONT)  # never leave the API server frozen
    assert result == [i * i for i in range(n)]
    assert thawed, "the map ended before the outage"
    assert kills and killed_in_outage, (kills, killed_in_outage)
    runs = collections.Counter(done.get(timeout=30) for _ in range(done.qsize()))
    assert set(runs) == set(range(n))
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= len(kills), duplicates
