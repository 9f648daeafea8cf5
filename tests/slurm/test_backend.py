"""Slurm-specific behaviour of the backend against the real test cluster: what the
submitted job looks like to Slurm, environment quoting, secrecy, batched polling,
listing, cancelling and jobs Slurm no longer knows."""

from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time
import urllib.parse

import pytest

from fiber.backend.job import Job, JobSpec, JobState


def spec(run_id: str, code: str, **fields) -> JobSpec:
    fields.setdefault("name", "worker-1")
    return JobSpec(command=[sys.executable, "-c", code],
                   labels={"fiber.run": run_id, "fiber.parent": "p1", **fields.pop("labels", {})},
                   **fields)


@pytest.fixture
def jobs(backend):
    created: list[Job] = []
    yield created
    for job in created:
        backend.terminate(job, force=True)
        backend.wait(job, 30)
        backend.release(job)


def scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, check=True).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def wait_running(backend, job, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while backend.status(job).state is not JobState.RUNNING:
        assert not backend.status(job).is_final, backend.status(job)
        assert time.monotonic() < deadline, "job never ran"
        time.sleep(0.1)


def wait_output(backend, job, text: str, timeout: float = 60) -> None:
    """Until the job has printed ``text`` (it has got that far in its own code)."""
    deadline = time.monotonic() + timeout
    while text not in backend.logs(job):
        assert not backend.status(job).is_final, backend.status(job)
        assert time.monotonic() < deadline, f"the job never printed {text!r}"
        time.sleep(0.1)


def test_requests_name_and_comment_reach_slurm(backend, jobs, run_id):
    job = backend.create_job(spec(run_id, "import time; time.sleep(600)", cpu=1.5,
                                  memory=300, labels={"team": "a b&c"}))
    jobs.append(job)
    info = scontrol(job.id)
    assert info["JobName"] == f"fiber-{run_id}"
    assert info["Partition"] == os.environ["FIBER_SLURM_PARTITION"]
    assert info["CPUs/Task"] == "2"
    assert info["MinMemoryNode"] == "300M"
    assert info["Requeue"] == "0"
    labels = dict(urllib.parse.parse_qsl(info["Comment"]))
    assert labels == {"fiber.run": run_id, "fiber.parent": "p1", "team": "a b&c",
                      "fiber.name": "worker-1"}
    assert info["StdOut"].startswith(os.environ["FIBER_SLURM_LOG_DIR"])
    wait_running(backend, job)
    assert job.host == "fibernode"


def test_env_values_are_quoted_exactly(backend, jobs, run_id):
    values = {"PLAIN": "x", "QUOTES": "it's \"quoted\"", "DOLLAR": "$HOME `id` $(id)",
              "NEWLINE": "a\nb", "SPACES": "  two  spaces ", "EMPTY": ""}
    job = backend.create_job(spec(
        run_id, f"import os; print(repr({{k: os.environ[k] for k in {sorted(values)!r}}}))",
        env=values))
    jobs.append(job)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED
    assert repr(dict(sorted(values.items()))) in backend.logs(job)


def test_secret_is_not_on_any_command_line_or_file(backend, jobs, run_id):
    secret = "s3cr3t-" + run_id
    job = backend.create_job(spec(run_id, "import time; time.sleep(600)",
                                  env={"_FIBER_SECRET": secret}))
    jobs.append(job)
    wait_running(backend, job)
    for cmdline in os.listdir("/proc"):
        if cmdline.isdigit():
            try:
                with open(f"/proc/{cmdline}/cmdline", "rb") as f:
                    assert secret.encode() not in f.read()
            except OSError:
                pass
    log_dir = os.environ["FIBER_SLURM_LOG_DIR"]
    for name in os.listdir(log_dir):
        with open(os.path.join(log_dir, name), "rb") as f:
            assert secret.encode() not in f.read(), name


def test_cwd_with_spaces(backend, jobs, run_id, tmp_path):
    where = tmp_path / "a dir with spaces"
    where.mkdir()
    job = backend.create_job(spec(run_id, "import os; print('cwd=' + os.getcwd())",
                                  cwd=str(where)))
    jobs.append(job)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED
    assert f"cwd={where}\n" in backend.logs(job)


def test_poll_is_one_squeue_call(backend, jobs, run_id):
    for i in range(4):
        jobs.append(backend.create_job(spec(run_id, f"import sys; sys.exit({i})")))
    for job in jobs:
        backend.wait(job, 60)
    fresh = type(backend)(backend.options)  # no cached final statuses
    calls: list[str] = []
    real_run = fresh.commands.run

    def spy(name, args, stdin=None):  # records the call, runs the real command
        calls.append(name)
        return real_run(name, args, stdin)

    fresh.commands.run = spy
    statuses = fresh.poll([Job(id=j.id, backend="slurm", spec=j.spec) for j in jobs])
    assert calls == ["squeue"]
    assert [statuses[j.id].exitcode for j in jobs] == [0, 1, 2, 3]
    assert [statuses[j.id].state for j in jobs] == [JobState.SUCCEEDED] + [JobState.FAILED] * 3


def test_list_jobs_by_labels(backend, jobs, run_id):
    mine = backend.create_job(spec(run_id, "import time; time.sleep(600)"))
    other = backend.create_job(spec(run_id + "x", "import time; time.sleep(600)"))
    jobs.extend([mine, other])
    found = backend.list_jobs({"fiber.run": run_id})
    assert [j.id for j in found] == [mine.id]
    assert found[0].spec.labels == {"fiber.run": run_id, "fiber.parent": "p1"}
    assert found[0].spec.name == "worker-1"
    assert {j.id for j in backend.list_jobs({"fiber.parent": "p1"})} >= {mine.id, other.id}
    assert backend.list_jobs({"fiber.run": run_id, "fiber.parent": "nobody"}) == []


def test_terminate_pending_job(make_backend, jobs, run_id):
    backend = make_backend(slurm_extra=["--begin=now+1hour"])
    job = backend.create_job(spec(run_id, "print('never')"))
    jobs.append(job)
    status = backend.status(job)
    assert status.state is JobState.PENDING
    assert status.reason == "BeginTime"
    backend.terminate(job)
    final = backend.wait(job, 30)
    assert final is not None and final.state is JobState.CANCELLED


def test_force_terminate_running_job(backend, jobs, run_id):
    job = backend.create_job(spec(
        run_id, "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(600)"))
    jobs.append(job)
    # RUNNING in Slurm's eyes comes before the interpreter has set SIGTERM aside
    wait_output(backend, job, "up")
    started = time.monotonic()
    backend.terminate(job, force=True)
    final = backend.wait(job, 30)
    assert final is not None and final.state is JobState.CANCELLED, final
    assert final.exitcode == -9  # SIGKILLed: SIGTERM is ignored by this job
    assert time.monotonic() - started < 20  # did not wait for KillWait (30 s)


def test_job_from_another_process(backend, jobs, run_id, make_backend):
    job = backend.create_job(spec(run_id, "print('from afar')"))
    jobs.append(job)
    backend.wait(job, 60)
    copy = pickle.loads(pickle.dumps(job))
    other = make_backend()
    assert other.status(copy).state is JobState.SUCCEEDED
    assert "from afar" in other.logs(copy)


def test_unknown_job_is_lost(backend):
    status = backend.status(Job(id="987654", backend="slurm", spec=JobSpec(command=["x"])))
    assert status.state is JobState.LOST
    assert "unknown to Slurm" in status.reason


def test_listen_address_is_the_route_to_slurmctld(backend):
    # the test cluster's slurmctld is on 127.0.0.1, so is the route to it
    assert backend.listen_address() == "127.0.0.1"
