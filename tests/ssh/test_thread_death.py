"""No thread of the ssh backend dies silently (issue #32), against the real sshd hosts
of the test engine (tests/engines/ssh.py).

As in tests/core/test_thread_death.py, the only fake is the exception:
``_FIBER_TEST_THREAD_FAULT`` (fiber.threads.FAULT_ENV) names the kind of thread that
raises ``RuntimeError`` as its first act; it is read when a thread starts, so setting it
in this process's environment for one test injects it into that test's backend only.
Each test checks that the call depending on the thread fails within 10 s naming it,
and (make_backend's teardown) that nothing is left running on the hosts.
"""

from __future__ import annotations

import sys
import time
import uuid

import pytest

from fiber import threads
from fiber.backend import ClusterUnreachableError, JobCreationError, JobSpec, JobState

SLEEP = "import time; time.sleep(600)"


def hosts_of(state) -> list[str]:
    return [f"root@{h['address']}:{h['port']}*1" for h in state["hosts"]]


def spec(code: str = SLEEP) -> JobSpec:
    labels = {"fiber.run": "thread-death-" + uuid.uuid4().hex[:8], "fiber.parent": "test"}
    return JobSpec(command=[sys.executable, "-c", code], labels=labels, name="death")


def test_prepare(make_backend, ssh_hosts, monkeypatch):
    """Every host's preparation dies: no host is used, and the job's creation fails at
    once (not retried as an outage) naming the thread."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    monkeypatch.setenv(threads.FAULT_ENV, "fiber-ssh-prepare")
    began = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match="fiber-ssh-prepare") as caught:
        backend.create_job(spec())
    assert time.monotonic() - began < 10
    assert caught.value.transient is False


def test_reader(make_backend, ssh_hosts, monkeypatch):
    """The job's reader dies before the job's pid is read: its creation fails naming
    the thread, and the job (its channel closed) ends on the host."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    monkeypatch.setenv(threads.FAULT_ENV, "fiber-ssh-reader")
    began = time.monotonic()
    with pytest.raises(JobCreationError, match="fiber-ssh-reader"):
        backend.create_job(spec())
    assert time.monotonic() - began < 10


def test_dispatch(make_backend, ssh_hosts, monkeypatch):
    """Both hosts' one slot is taken: the next job waits for the dispatcher, which dies;
    that job fails (its log says why) instead of waiting for ever."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_when_full="wait")
    busy = [backend.create_job(spec()) for _ in range(2)]
    try:
        monkeypatch.setenv(threads.FAULT_ENV, "fiber-ssh-dispatch")
        began = time.monotonic()
        waiting = backend.create_job(spec())
        status = backend.wait(waiting, 10)
        assert status is not None and status.state is JobState.FAILED, status
        assert time.monotonic() - began < 10
        assert "fiber-ssh-dispatch" in backend.logs(waiting), backend.logs(waiting)
        backend.release(waiting)
    finally:
        for job in busy:
            backend.terminate(job, force=True)
        for job in busy:
            backend.wait(job, 30)
            backend.release(job)


def test_kill(make_backend, ssh_hosts, monkeypatch):
    """A job terminated before its pid is known is killed, once the pid comes, by a
    thread of its reader; that thread dies: the job's channel is closed instead, and
    the job ends all the same."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts), ssh_start_timeout=0.5)
    monkeypatch.setenv(threads.FAULT_ENV, "fiber-ssh-kill")
    # The order is forced, not hoped for: the job's reader is held before its first
    # read, so its pid cannot be known before terminate() (a start timeout alone left
    # that to the machine's load, and a loaded one read the pid first: issue #44).
    with threads.hold("fiber-ssh-reader") as reader:
        job = backend.create_job(spec())  # (returns after ssh_start_timeout, no pid)
        handle = job.handle
        assert handle.pid is None
        assert backend.status(job).state is JobState.PENDING
        backend.terminate(job)
        reader.set()
        status = backend.wait(job, 10)
    assert status is not None and status.is_final, status
    assert handle.pid is not None  # the reader read it after terminate()...
    # ...and started the kill thread, which died
    assert any(name.startswith("fiber-ssh-kill") for name, _ in threads.deaths())
    backend.release(job)


def test_search(make_backend, ssh_hosts, monkeypatch):
    """Every host's search for jobs dies: listing the jobs fails naming the thread
    (what `fiber jobs` and `fiber clean` would otherwise report as nothing found)."""
    backend = make_backend(ssh_hosts=hosts_of(ssh_hosts))
    monkeypatch.setenv(threads.FAULT_ENV, "fiber-ssh-search")
    with pytest.raises(ClusterUnreachableError, match="fiber-ssh-search"):
        backend.list_jobs({"fiber.parent": "test"})
