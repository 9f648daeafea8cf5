"""A host that becomes unreachable (its link cut on the real test network) marks its
jobs LOST within the keepalive / dead-after time; the other host keeps working."""

from __future__ import annotations

import sys
import time

from ssh_helpers import kill_host_processes, set_link

from fiber.backend.job import JobSpec, JobState

SLEEP = "import socket, time; print(socket.gethostname(), flush=True); time.sleep(600)"
LABELS = {"fiber.run": "host-loss", "fiber.parent": "test"}


def spec(code: str) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", code], labels=dict(LABELS))


def test_cut_off_host_loses_its_jobs(make_backend, ssh_hosts):
    entries = [f"root@{h['address']}:{h['port']}*2" for h in ssh_hosts["hosts"]]
    backend = make_backend(ssh_hosts=entries, ssh_keepalive=1.0, ssh_dead_after=3.0)
    jobs = [backend.create_job(spec(SLEEP)) for _ in range(2)]
    by_host = {job.host: job for job in jobs}
    assert set(by_host) == {e.split("*")[0] for e in entries}
    lost = by_host[entries[1].split("*")[0]]
    kept = by_host[entries[0].split("*")[0]]
    deadline = time.monotonic() + 20
    while "h2" not in backend.logs(lost) and time.monotonic() < deadline:
        time.sleep(0.05)
    set_link(ssh_hosts, 1, up=False)
    try:
        started = time.monotonic()
        status = backend.wait(lost, 30)
        assert status is not None, "the job of the cut-off host was not noticed as lost"
        assert status.state is JobState.LOST
        assert time.monotonic() - started < 15
        assert backend.status(kept).state is JobState.RUNNING
        # new jobs go to the host that is left
        job = backend.create_job(spec("import socket; print(socket.gethostname())"))
        assert backend.wait(job, 30).state is JobState.SUCCEEDED
        assert backend.logs(job).strip() == "h1"
    finally:
        set_link(ssh_hosts, 1, up=True)
        kill_host_processes(ssh_hosts, 1)


def test_job_created_just_after_a_host_is_cut_off_runs_elsewhere(make_backend, ssh_hosts):
    entries = [f"root@{h['address']}:{h['port']}*3" for h in ssh_hosts["hosts"]]
    backend = make_backend(ssh_hosts=entries, ssh_keepalive=1.0, ssh_dead_after=3.0,
                           ssh_connect_timeout=3.0)
    jobs = [backend.create_job(spec(SLEEP)) for _ in range(3)]  # h1, h2, h1
    assert [job.host for job in jobs] == [e.split("*")[0] for e in (entries[0], entries[1],
                                                                     entries[0])]
    set_link(ssh_hosts, 1, up=False)
    try:
        # h2 has the most free slots, so it is tried first, fails, and h1 runs the job
        job = backend.create_job(spec("import socket; print(socket.gethostname())"))
        assert job.host == entries[0].split("*")[0]
        assert backend.wait(job, 30).state is JobState.SUCCEEDED
        assert backend.logs(job).strip() == "h1"
        assert backend.wait(jobs[1], 30).state is JobState.LOST
    finally:
        set_link(ssh_hosts, 1, up=True)
        kill_host_processes(ssh_hosts, 1)
