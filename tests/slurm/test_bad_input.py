"""Bad input against the real test cluster: every case gets an error that says what
happened and what to do."""

from __future__ import annotations

import os
import time

import pytest

from fiber.backend import ClusterUnreachableError, JobCreationError
from fiber.backend.job import JobSpec, JobState
from fiber.backend.options import ConfigError
from fiber_slurm.options import OPTIONS


def spec(run_id: str, code: str = "print('x')", **fields) -> JobSpec:
    import sys

    return JobSpec(command=[sys.executable, "-c", code], name="bad-input",
                   labels={"fiber.run": run_id, "fiber.parent": "test"}, **fields)


def test_no_slurm_commands_on_path(make_backend, run_id, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    backend = make_backend()
    with pytest.raises(ClusterUnreachableError) as info:
        backend.create_job(spec(run_id))
    message = str(info.value)
    assert "sbatch" in message and "PATH" in message and "nstall" in message


def test_bin_dir_without_slurm(make_backend, run_id, tmp_path):
    backend = make_backend(slurm_bin_dir=str(tmp_path))
    with pytest.raises(ClusterUnreachableError, match="FIBER_SLURM_BIN_DIR"):
        backend.create_job(spec(run_id))


def test_controller_unreachable(make_backend, run_id, tmp_path, monkeypatch):
    conf = open(os.environ["SLURM_CONF"]).read().splitlines()
    # the port closed; sbatch tries to connect for MessageTimeout seconds before it
    # gives up (the engine's 30 made this test take 29 s), 3 gives the same answer
    closed = ["SlurmctldPort=1" if line.startswith("SlurmctldPort=") else
              "MessageTimeout=3" if line.startswith("MessageTimeout=") else line
              for line in conf]
    (tmp_path / "slurm.conf").write_text("\n".join(closed) + "\n")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    backend = make_backend()
    with pytest.raises(ClusterUnreachableError) as info:
        backend.create_job(spec(run_id))
    assert "Unable to contact slurm controller" in str(info.value)
    assert "scontrol ping" in str(info.value)


def test_invalid_partition(make_backend, run_id, squeue_live):
    backend = make_backend(slurm_partition="no-such-partition")
    with pytest.raises(JobCreationError) as info:
        backend.create_job(spec(run_id))
    assert "Invalid partition" in str(info.value)
    assert squeue_live("fiber-" + run_id) == []


@pytest.mark.parametrize("fields, expected", [
    ({"memory": 100 * 1024}, "Requested node configuration is not available"),
    ({"gpu": 1}, "Invalid generic resource"),
])
def test_rejected_submission_shows_sbatch_error(make_backend, run_id, fields, expected):
    backend = make_backend()
    with pytest.raises(JobCreationError) as info:
        backend.create_job(spec(run_id, **fields))
    assert expected in str(info.value)
    assert "sbatch refused job bad-input" in str(info.value)


def test_rejected_extra_option(make_backend, run_id):
    backend = make_backend(slurm_extra=["--constraint=no-such-feature"])
    with pytest.raises(JobCreationError, match="Invalid feature specification"):
        backend.create_job(spec(run_id))


def test_bad_env_name_is_refused(make_backend, run_id):
    backend = make_backend()
    with pytest.raises(JobCreationError, match="not a valid shell name"):
        backend.create_job(spec(run_id, env={"BAD-NAME": "1"}))


@pytest.mark.parametrize("name, value, expected", [
    ("slurm_time", "soon", "time limit such as"),
    ("slurm_extra", "exclusive", "is not an sbatch option"),
    ("slurm_poll_interval", "0", "positive"),
])
def test_bad_settings_are_refused(name, value, expected):
    option = next(o for o in OPTIONS if o.name == name)
    with pytest.raises(ConfigError, match=expected):
        option.convert(value, option.env_var)


def test_a_job_with_a_time_limit_starts(time_limited_job):
    """The job of test_time_limit.py, which Slurm must end after one minute: it runs
    (submitted here, early, so that its minute overlaps the tests in between)."""
    backend, job = time_limited_job["backend"], time_limited_job["job"]
    deadline = time.monotonic() + 60
    while "up" not in backend.logs(job):
        assert time.monotonic() < deadline, "the time-limited job never started"
        time.sleep(0.2)
    assert backend.status(job).state is JobState.RUNNING
