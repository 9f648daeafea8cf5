"""Placement across the two real test hosts: most free slots first, cpu/memory
requests, waiting for a slot (ssh_when_full=wait) or failing (ssh_when_full=fail)."""

from __future__ import annotations

import sys
import time
import uuid

import pytest

from fiber.backend import JobCreationError
from fiber.backend.job import JobSpec, JobState

SLEEP = "import socket, time; print(socket.gethostname(), flush=True); time.sleep(600)"


def hosts_of(state) -> list[str]:
    return [f"root@{h['address']}:{h['port']}*2" for h in state["hosts"]]


def spec(code: str, **fields) -> JobSpec:
    labels = {"fiber.run": "placement-" + uuid.uuid4().hex[:8], "fiber.parent": "test"}
    return JobSpec(command=[sys.executable, "-c", code], labels=labels, **fields)


def running_hostname(backend, job, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = backend.logs(job).strip()
        if text:
            return text.splitlines()[0]
        assert not backend.status(job).is_final, backend.logs(job)
        time.sleep(0.05)
    raise AssertionError(f"job {job.id} printed nothing")


def test_jobs_spread_over_both_hosts(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    jobs = [backend.create_job(spec(SLEEP)) for _ in range(4)]
    names = sorted(running_hostname(backend, job) for job in jobs)
    assert names == ["h1", "h1", "h2", "h2"]
    # the job's reported host is the one it runs on
    for job in jobs:
        entry = hosts_of(ssh_hosts)[int(running_hostname(backend, job)[1]) - 1]
        assert job.host == entry.split("*")[0]
    for job in jobs:
        backend.terminate(job)
    for job in jobs:
        assert backend.wait(job, 30).state is JobState.CANCELLED
        backend.release(job)


def test_a_group_created_at_once_spreads_over_both_hosts(make_backend, ssh_hosts):
    """create_jobs (the contract's default: create_job for each, several at once, as a
    pool's group): the jobs go to the host with the most free slots each, two and two,
    not all to the first."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    jobs = backend.create_jobs([spec(SLEEP) for _ in range(4)])
    assert all(not isinstance(job, BaseException) for job in jobs), jobs
    names = sorted(running_hostname(backend, job) for job in jobs)
    assert names == ["h1", "h1", "h2", "h2"]
    assert backend.terminate_jobs(jobs) == {}
    for job in jobs:
        assert backend.wait(job, 30).state is JobState.CANCELLED
        backend.release(job)


def test_full_hosts_make_jobs_wait_for_a_slot(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_when_full="wait")
    jobs = [backend.create_job(spec(SLEEP)) for _ in range(4)]
    waiting = backend.create_job(spec("print('got a slot')"))
    time.sleep(1.0)
    assert backend.status(waiting).state is JobState.PENDING
    assert backend.wait(waiting, 0.1) is None
    assert waiting in backend.list_jobs(waiting.spec.labels)
    backend.terminate(jobs[0], force=True)
    status = backend.wait(waiting, 30)
    assert status is not None and status.state is JobState.SUCCEEDED, backend.logs(waiting)
    assert "got a slot" in backend.logs(waiting)
    # a pending job can be cancelled before it ever runs
    queued = [backend.create_job(spec(SLEEP)) for _ in range(2)]
    assert backend.status(queued[1]).state is JobState.PENDING
    backend.terminate(queued[1])
    assert backend.wait(queued[1], 1).state is JobState.CANCELLED


def test_full_hosts_fail_when_asked(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_when_full="fail")
    for _ in range(4):
        backend.create_job(spec(SLEEP))
    with pytest.raises(JobCreationError, match="no SSH host has a free slot.*FIBER_SSH_WHEN_FULL=wait"):
        backend.create_job(spec(SLEEP))


def test_cpu_request_takes_slots_on_one_host(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_when_full="fail")
    small = backend.create_job(spec(SLEEP))
    big = backend.create_job(spec(SLEEP, cpu=2))
    # the 2-core job needs a whole host: the other one
    assert running_hostname(backend, small) != running_hostname(backend, big)
    backend.create_job(spec(SLEEP, cpu=0.5))  # fills the small job's host
    with pytest.raises(JobCreationError):
        backend.create_job(spec(SLEEP))


def test_impossible_requests_are_clear_errors(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    with pytest.raises(JobCreationError, match=r"needs 3 slot\(s\).*lower the job's cpu"):
        backend.create_job(spec("pass", cpu=3))
    with pytest.raises(JobCreationError, match="MiB"):
        backend.create_job(spec("pass", memory=10 ** 9))


def test_memory_request_is_counted(make_backend, ssh_hosts):
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_when_full="fail")
    # private read: the host's slots and memory as the backend counts them (no API shows them)
    host = backend._hosts[0]
    backend.create_job(spec("pass"))  # connects and reads MemTotal
    total = host.memory
    assert total and total > 100
    jobs = [backend.create_job(spec(SLEEP, memory=total * 3 // 4)) for _ in range(2)]
    assert {running_hostname(backend, job) for job in jobs} == {"h1", "h2"}
    with pytest.raises(JobCreationError, match="no SSH host has a free slot"):
        backend.create_job(spec(SLEEP, memory=total * 3 // 4))


def test_slots_default_to_the_cpu_count(make_backend, ssh_hosts):
    import os

    entries = [entry.split("*")[0] for entry in hosts_of(ssh_hosts)]
    backend = make_backend(ssh_hosts=entries)
    job = backend.create_job(spec("pass"))
    assert backend.wait(job, 30).state is JobState.SUCCEEDED
    # private read: the slots the backend found on each host
    assert [h.slots for h in backend._hosts] == [os.cpu_count()] * 2
