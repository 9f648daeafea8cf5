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
import subprocess
import sys
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


def test_terminate_during_an_outage_returns_within_seconds(slurm_cluster, squeue_live):
    """With slurmctld frozen, ``terminate()`` and ``join()`` of a busy pool return
    within seconds (its connected workers are told to end over their own connection;
    the ``scancel`` that cannot reach the controller goes on in the background), and
    once the controller is back nothing is left."""
    ctld = _ctld_pid(slurm_cluster)
    run = run_id()
    pool = fiber.Pool(4)
    try:
        pool.map(abs, range(8))
        result = pool.map_async(time.sleep, [0.02] * 2000, chunksize=1)
        os.kill(ctld, signal.SIGSTOP)
        try:
            started = time.monotonic()
            pool.terminate()
            pool.join()
            took = time.monotonic() - started
        finally:
            os.kill(ctld, signal.SIGCONT)
    finally:
        os.kill(ctld, signal.SIGCONT)
        pool.terminate()
    assert took < 6, f"terminate() and join() took {took:.1f} s during the outage"
    assert result.ready() and not result.successful()
    deadline = time.monotonic() + 90
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, squeue_live(f"fiber-{run}")
        time.sleep(0.2)


EXITS_DURING_AN_OUTAGE = """
import os, signal, sys, time
import fiber
from fiber.runtime.run import run_id

def square(x):
    time.sleep(0.02)
    return x * x

@fiber.meta(cpu=64)  # the node's every CPU: pending while the pool's workers run
def sleeper():
    time.sleep(600)

if __name__ == "__main__":
    ctld = int(sys.argv[1])
    pool = fiber.Pool(2)
    pool.map(abs, range(4))
    result = pool.map_async(square, range(2000), chunksize=1)
    pending = fiber.Process(target=sleeper, daemon=True)
    pending.start()
    print(run_id(), pending.job_id, flush=True)
    os.kill(ctld, signal.SIGSTOP)
    print("leaving", flush=True)
"""


def test_exit_during_an_outage_is_bounded_and_says_what_is_left(slurm_cluster,
                                                                  squeue_live, tmp_path):
    """A program exits while slurmctld is frozen, with a busy pool and a daemonic
    Process whose job is still pending (it asks for every CPU of the node): the exit takes seconds, not the
    controller's time-outs; a warning names the job the cluster could not end and
    says how to end it; once the controller is back, ``fiber clean`` ends it and
    nothing is left."""
    ctld = _ctld_pid(slurm_cluster)
    script = tmp_path / "exits.py"
    script.write_text(EXITS_DURING_AN_OUTAGE)
    proc = subprocess.Popen([sys.executable, str(script), str(ctld)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, cwd=tmp_path)
    try:
        line = proc.stdout.readline()
        assert line, proc.communicate()[1]
        run, held_job = line.split()
        assert proc.stdout.readline().strip() == "leaving"
        started = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - started
    finally:
        os.kill(ctld, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert took < 8, f"the exit took {took:.1f} s during the outage\n{err}"
    assert "may still be running" in err and held_job in err and "fiber clean" in err, err
    assert "Traceback" not in err, err
    cleaned = subprocess.run([sys.executable, "-c",
                              "import sys; from fiber.cli import main; sys.exit(main())",
                              "clean", "--run", run],
                             capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL,
                             env={**os.environ, "FIBER_BACKEND": "slurm"})
    assert cleaned.returncode == 0, cleaned.stderr
    deadline = time.monotonic() + 90
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, (squeue_live(f"fiber-{run}"), cleaned.stdout)
        time.sleep(0.2)
