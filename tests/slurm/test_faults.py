"""Faults injected into the real Slurm test cluster cost time, never results (#17).

slurmctld is frozen (SIGSTOP, by the pid the engine script recorded) for 10 s in the
middle of a map while the pool's workers, real Slurm jobs, are SIGKILLed at random: a
worker killed during the outage must be replaced by an ``sbatch`` that cannot reach
the controller until it is thawed (SIGCONT). Every result arrives exactly once,
executions are counted in a real file, and nothing is left in Slurm afterwards.
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
from fiber.runtime.run import run_id


def record(path: str, i: int) -> int:
    """A task of 20 ms that records its execution once it is complete."""
    time.sleep(0.02)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i


def _ctld_pid(slurm_cluster: dict[str, str]) -> int:
    state = Path(slurm_cluster["SLURM_CONF"]).parent
    return int((state / "pids" / "slurmctld.pid").read_text())


def test_controller_outage_and_killed_workers_lose_nothing(slurm_cluster, squeue_live,
                                                           tmp_path):
    log = tmp_path / "executions"
    n = 5000
    ctld = _ctld_pid(slurm_cluster)
    run = run_id()
    kills: list[int] = []
    killed_in_outage: list[int] = []
    outage = threading.Event()
    stop = threading.Event()
    timings: dict[str, float] = {}
    pool = fiber.Pool(8)
    try:
        pool.map(abs, range(16))  # the workers are up

        def busy_pids() -> list[int]:
            return [w.process.pid for w in pool.stats().workers
                    if w.state == "busy" and w.process is not None and w.process.pid
                    and w.process.pid not in kills]

        def killer() -> None:
            rnd = random.Random(23)
            while len(kills) < 6 and not stop.wait(0.7):
                live = busy_pids()
                if live:
                    pid = rnd.choice(live)
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                    if outage.is_set():
                        killed_in_outage.append(pid)

        def freezer() -> None:
            if stop.wait(2.0):
                return
            os.kill(ctld, signal.SIGSTOP)
            outage.set()
            timings["outage"] = time.monotonic()
            try:
                stop.wait(10.0)
            finally:
                os.kill(ctld, signal.SIGCONT)
                outage.clear()
                timings["thawed"] = time.monotonic()

        threads = [threading.Thread(target=killer), threading.Thread(target=freezer)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        try:
            result = pool.map(functools.partial(record, str(log)), range(n), chunksize=1)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        timings["map"] = time.monotonic() - started
    finally:
        os.kill(ctld, signal.SIGCONT)  # never leave the controller frozen
        pool.terminate()
        pool.join()
    assert result == [i * i for i in range(n)]
    assert "thawed" in timings, f"the map ended before the outage ({timings})"
    assert kills and killed_in_outage, (kills, killed_in_outage)
    runs = collections.Counter(int(line) for line in log.read_text().split())
    assert set(runs) == set(range(n))
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= len(kills), duplicates
    print(f"map of {n} tasks with {len(kills)} kills and a 10 s controller outage: "
          f"{timings['map']:.1f} s")
    deadline = time.monotonic() + 60
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, squeue_live(f"fiber-{run}")
        time.sleep(0.2)
