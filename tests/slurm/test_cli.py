"""The ``fiber`` command line on the slurm backend against the real test cluster:
``fiber run`` as a Slurm job, ``fiber jobs`` and ``fiber clean`` finding a run's jobs
by their Slurm comment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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
        # cancelled by another process: CANCELLED, or FAILED if Slurm saw the SIGKILL
        # end the job first; either way it was SIGKILLed
        assert final.state in (JobState.CANCELLED, JobState.FAILED) and final.exitcode == -9
        assert squeue_live(f"fiber-{run_id}") == []
        assert fiber_cli("jobs", "--run", run_id).stdout == (
            f"no fiber jobs of run {run_id} on the slurm backend\n")
    finally:
        backend.terminate(job, force=True)
        backend.release(job)
