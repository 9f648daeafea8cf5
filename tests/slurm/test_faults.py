"""Faults injected into the real Slurm test cluster cost time, never results (#17).

slurmctld is frozen (SIGSTOP, by the pid the engine script recorded) for 10 s in the
middle of a 5,000-task map while the pool's workers, real Slurm jobs, are SIGKILLed at
random (tests/fault_map.py drives both; the freeze is the engine's, tests/engines/slurm.py):
a worker killed during the outage must be replaced by an ``sbatch`` that cannot reach
the controller until it is thawed (SIGCONT). Every result arrives exactly once,
executions are counted in a real file, duplicates stay within the kills, and nothing is
left in Slurm nor in /dev/shm afterwards.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time

import fault_map
from engines import slurm as slurm_engine

import fiber
from fiber.runtime.run import run_id


def test_controller_outage_and_killed_workers_lose_nothing(slurm_cluster, squeue_live,
                                                           tmp_path):
    log = str(tmp_path / "executions")
    n = 5000
    run = run_id()
    shm_before = fault_map.shm_names()
    pool = fiber.Pool(8)
    try:
        pool.map(abs, range(16))  # the workers are up
        result, faults = fault_map.map_under_faults(
            pool, functools.partial(fault_map.record, log), n, kills=6, every=0.7,
            seed=23, freeze=slurm_engine.freeze, thaw=slurm_engine.thaw,
            outage_after=2.0, outage_seconds=10.0)
    finally:
        slurm_engine.thaw()  # never leave the controller frozen
        pool.terminate()
        pool.join()
    fault_map.check_exactly_once(result, n, fault_map.executions_in(log), faults)
    print(f"map of {n} tasks with {len(faults.kills)} kills and a 10 s controller outage: "
          f"{faults.seconds:.1f} s")
    deadline = time.monotonic() + 60
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, squeue_live(f"fiber-{run}")
        time.sleep(0.2)
    assert not fault_map.dead_segments(shm_before)


def test_terminate_during_an_outage_returns_within_seconds(slurm_cluster, squeue_live):
    """With slurmctld frozen, ``terminate()`` and ``join()`` of a busy pool return
    within seconds (its connected workers are told to end over their own connection;
    the ``scancel`` that cannot reach the controller goes on in the background), and
    once the controller is back nothing is left."""
    (ctld,) = slurm_engine.manager_pids()
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
    (ctld,) = slurm_engine.manager_pids()
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
