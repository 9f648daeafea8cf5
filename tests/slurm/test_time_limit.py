"""Slurm's time limit, enforced on a real job: Slurm ends it as TIMEOUT, which the
backend reports as FAILED with that reason. Time limits are whole minutes, so the job
(``time_limited_job`` in conftest.py) is submitted by an early test and checked here,
late in the session; run alone, this test takes a minute or two."""

from __future__ import annotations

import re
import subprocess
import time

from fiber.backend.job import JobState


def _run_seconds(job_id: str) -> int:
    """How long the job ran, by Slurm's own record (``RunTime``, [D-]HH:MM:SS)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, check=True).stdout
    found = re.search(r"\bRunTime=(?:(\d+)-)?(\d+):(\d+):(\d+)", out)
    assert found, out
    days, h, m, s = (int(x or 0) for x in found.groups())
    return ((days * 24 + h) * 60 + m) * 60 + s


def test_time_limit_is_failed_timeout(time_limited_job):
    backend, job = time_limited_job["backend"], time_limited_job["job"]
    try:
        left = 200 - (time.monotonic() - time_limited_job["created"])
        status = backend.wait(job, max(left, 1))
        assert status is not None, "the time limit was not enforced within 200 s"
        assert status.state is JobState.FAILED
        assert status.reason == "TIMEOUT"
        assert status.exitcode is not None and status.exitcode != 0
        assert 55 <= _run_seconds(job.id) < 200
        assert "up" in backend.logs(job)
    finally:
        backend.terminate(job, force=True)
        backend.release(job)
        time_limited_job["released"] = True
