"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real Slurm test cluster (up to 4: each worker a Slurm job), issue #28.

A long enough map uses both and after the idle timeout both are back at zero, nothing
left in Slurm. With slurmctld frozen (SIGSTOP, the engine's fault, as in
test_faults.py) during a burst, the Slurm starts hang: the local workers carry on,
every result arrives once (counted by the tasks in a real file), and one warning says
the Slurm placement is skipped. With the partition DOWN (scontrol), the jobs the
cluster queues count as coming (no more are submitted) and are cancelled once the
burst is over. Nothing is faked."""

from __future__ import annotations

import logging
import os
import subprocess
import time

import fault_map
import pytest
from adapt_burst import burst_and_back, held, wait_for
from engines import slurm as slurm_engine

import fiber
from fiber.runtime.run import run_id

pytestmark = pytest.mark.timeout(240)


def where(i: int) -> tuple[int, float, str | None]:
    """The task's number, when it began, and its Slurm job (None: not in a Slurm job)."""
    began = time.time()
    time.sleep(0.5)
    return i, began, os.environ.get("SLURM_JOB_ID")


def where_briefly(i: int) -> tuple[int, float, str | None]:
    """As :func:`where`, 0.2 s long."""
    began = time.time()
    time.sleep(0.2)
    return i, began, os.environ.get("SLURM_JOB_ID")


def test_a_burst_goes_from_local_to_slurm_and_back(slurm_cluster, squeue_live):
    """local max 2, then slurm max 4: the map runs on both, each task once; the pool
    never holds more than each placement's maximum; after the idle timeout both are at
    zero and the Slurm jobs are gone; the time from the map to the first task on a
    Slurm worker is printed (bench/RESULTS.md section 13; adapt_burst.burst_and_back)."""
    run = run_id()
    burst_and_back("slurm", 4, where, lambda job: job is not None,
                   lambda: squeue_live(f"fiber-{run}"), "no Slurm job left", n=60)


def test_controller_frozen_during_a_burst_local_carries_on(slurm_cluster, squeue_live,
                                                           tmp_path, caplog):
    """slurmctld frozen before a burst: the Slurm starts hang (sbatch waits for the
    controller), the placement is skipped after adapt.STALL seconds with one warning,
    the local workers run every task exactly once; once the controller is back, the
    pool gives back what came late and nothing is left in Slurm."""
    caplog.set_level(logging.WARNING, logger="fiber")
    log = str(tmp_path / "executions")
    n = 500
    run = run_id()
    local, slurm = fiber.get_context("local"), fiber.get_context("slurm")
    pool = fiber.Pool(1, context=local)
    try:
        # (adapt asks the controller for the address Slurm jobs reach: before the freeze)
        pool.adapt(0, placements=[(local, 2), (slurm, 4)], idle_timeout=1.0)
        slurm_engine.freeze()
        try:
            started = time.monotonic()
            out = pool.map(_record_slow, [(log, i) for i in range(n)], chunksize=1)
            took = time.monotonic() - started
            skipped = [r.getMessage() for r in caplog.records
                       if r.name == "fiber" and "skipped" in r.getMessage()]
            places = pool.stats().adapt.placements
        finally:
            slurm_engine.thaw()
        assert out == [i * i for i in range(n)]
        runs = fault_map.executions_in(log)
        assert sorted(runs) == list(range(n)) and set(runs.values()) == {1}
        assert len(skipped) == 1 and "placement 1 (slurm)" in skipped[0], skipped
        assert places[1].busy == 0 and places[1].idle == 0, places
        print(f"{n} tasks with slurmctld frozen: {took:.1f} s on the local workers")
        wait_for(lambda: held(pool) == [0, 0], 120, "both placements at zero")
    finally:
        slurm_engine.thaw()
        pool.terminate()
        pool.join()
    wait_for(lambda: not squeue_live(f"fiber-{run}"), 120, "no Slurm job left")


def _record_slow(args: tuple[str, int]) -> int:
    path, i = args
    time.sleep(0.01)
    return fault_map.record(path, i)


def _partition(state: str) -> None:
    """The test partition's state: DOWN queues new jobs without running them (the
    cluster's own way to be full for a while), UP runs them again."""
    subprocess.run(["scontrol", "update", f"PartitionName={slurm_engine.PARTITION}",
                    f"State={state}"], check=True, capture_output=True, text=True)


def _squeue_states(name: str) -> list[str]:
    """The state of each job named ``name`` (-r: each task of a job array, which the
    backend submits a group of workers as, on a line of its own)."""
    done = subprocess.run(["squeue", "-h", "-r", "-n", name, "-o", "%T"], capture_output=True,
                          text=True, check=True)
    return done.stdout.split()


def test_jobs_the_cluster_queues_count_as_coming_and_are_cancelled(slurm_cluster,
                                                                   squeue_live):
    """The Slurm partition is DOWN (scontrol: jobs are accepted and queued, none runs):
    a burst on local max 1 then slurm max 3 submits 3 Slurm jobs and no more while they
    wait (the stats count them pending, squeue shows at most 3, all PENDING), the local
    worker runs every task; as the queue drains the pool cancels them (squeue empty,
    the partition still down), and adapting's decisions say so (3 cancelled in all). The partition
    is set UP again whatever happens."""
    run = run_id()
    name = f"fiber-{run}"
    local, slurm = fiber.get_context("local"), fiber.get_context("slurm")
    pool = fiber.Pool(1, context=local)
    _partition("DOWN")
    try:
        pool.adapt(0, placements=[(local, 1), (slurm, 3)], idle_timeout=30.0)
        result = pool.map_async(where_briefly, range(40), chunksize=1)
        most_jobs, most_pending, states = 0, 0, set()
        while not result.ready():
            jobs = _squeue_states(name)
            states.update(jobs)
            most_jobs = max(most_jobs, len(jobs))
            most_pending = max(most_pending, pool.stats().adapt.placements[1].pending)
            time.sleep(0.2)
        out = result.get()
        assert len(out) == 40 and all(job is None for _, _, job in out)  # all on local
        assert most_jobs == 3 and most_pending == 3, (most_jobs, most_pending)
        assert states == {"PENDING"}, states
        assert pool.stats().started <= 1 + 3, pool.stats().started
        wait_for(lambda: not squeue_live(name), 30, "the pending Slurm jobs cancelled")
        # cancelled as they were no longer needed: as the queue drained, or at its end
        decisions = pool.stats().adapt.decisions
        cancelled = [int(r.split("cancel ")[1].split()[0]) for _, r in decisions
                     if "cancel " in r]
        assert sum(cancelled) == 3, decisions
    finally:
        _partition("UP")
        pool.terminate()
        pool.join()
    wait_for(lambda: not squeue_live(name), 60, "no Slurm job left")
