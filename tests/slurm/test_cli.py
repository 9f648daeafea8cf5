"""The ``fiber`` command line on the slurm backend against the real test cluster:
``fiber run`` as a Slurm job, ``fiber jobs`` and ``fiber clean`` finding a run's jobs
by their Slurm comment."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from engines import slurm as slurm_engine

from fiber.backend.job import JobSpec, JobState

FIBER = [sys.executable, "-c", "import sys; from fiber.cli import main; sys.exit(main())"]


def fiber_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "FIBER_BACKEND": "slurm"}
    return subprocess.run([*FIBER, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_fiber_run_is_a_slurm_job(slurm_cluster):
    done = fiber_cli("run", "--", sys.executable, "-c",
                     "import os; print('job', os.environ['SLURM_JOB_ID']); raise SystemExit(4)")
    assert done.returncode == 4, done.stderr
    assert "job " in done.stdout


def test_fiber_jobs_and_clean(backend, run_id, squeue_live):
    job = backend.create_job(JobSpec(
        command=[sys.executable, "-c", "import time; time.sleep(600)"], name="sleeper",
        labels={"fiber.run": run_id, "fiber.parent": "cli-test"}))
    try:
        deadline = time.monotonic() + 60
        while backend.status(job).state is not JobState.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        listed = fiber_cli("jobs", "--run", run_id)
        assert listed.returncode == 0, listed.stderr
        assert f"{job.id}  running" in listed.stdout and "sleeper" in listed.stdout
        cleaned = fiber_cli("clean", "--run", run_id)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"removed {job.id}" in cleaned.stdout
        final = backend.wait(job, 30)
        # `fiber clean` SIGKILLs the job's batch step and sends no cancel after it
        # (docs/cli.md): Slurm records the job FAILED by signal 9, and that is what any
        # other process sees (only the process that ended it reports it CANCELLED)
        assert final is not None and final.state is JobState.FAILED, final
        assert final.exitcode == -9, final
        assert squeue_live(f"fiber-{run_id}") == []
        assert fiber_cli("jobs", "--run", run_id).stdout == (
            f"no fiber jobs of run {run_id} on the slurm backend\n")
    finally:
        backend.terminate(job, force=True)
        backend.release(job)


def test_clean_kills_a_job_whose_batch_step_has_not_launched(backend, run_id, squeue_live):
    """Slurm lists a job RUNNING from its allocation on, before slurmd has launched its
    batch step, and slurmd drops a signal for a step it does not have yet. The node's
    slurmd is frozen (the engine's freeze_node, SIGSTOP) so that the job cannot launch,
    `fiber clean` runs, and slurmd is thawed 3 s later: the job still ends by SIGKILL.
    (Before issue #44's fix the SIGKILL was lost and the plain cancel sent after it
    ended the job, SIGTERM: CANCELLED, reported -15, as on the loaded CI run.)"""
    slurm_engine.freeze_node()
    thaw = threading.Timer(3, slurm_engine.thaw_node)
    job = None
    try:
        job = backend.create_job(JobSpec(
            command=[sys.executable, "-c", "import time; time.sleep(600)"], name="late",
            labels={"fiber.run": run_id, "fiber.parent": "cli-test"}))
        deadline = time.monotonic() + 60
        while backend.status(job).state is not JobState.RUNNING:  # allocated, not launched
            assert time.monotonic() < deadline
            time.sleep(0.1)
        thaw.start()
        cleaned = fiber_cli("clean", "--run", run_id)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"removed {job.id}" in cleaned.stdout
        final = backend.wait(job, 30)
        assert final is not None and final.state is JobState.FAILED, final
        assert final.exitcode == -9, final
        assert squeue_live(f"fiber-{run_id}") == []
    finally:
        thaw.cancel()
        slurm_engine.thaw_node()
        if job is not None:
            backend.terminate(job, force=True)
            backend.release(job)
