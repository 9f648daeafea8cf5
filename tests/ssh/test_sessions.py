"""Unusual but real servers, each an extra sshd in host h1's namespace: more jobs than
``MaxSessions`` allows per connection (the backend opens further connections), and a
login shell that is slow and prints noise before the job starts."""

from __future__ import annotations

import sys
import time

from ssh_helpers import ExtraSSHD

from fiber.backend.job import JobSpec, JobState

SLEEP = "import time; print('up', flush=True); time.sleep(600)"
LABELS = {"fiber.run": "sessions", "fiber.parent": "test"}


def spec(code: str, **fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", code], labels=dict(LABELS), **fields)


def test_session_limit_opens_more_connections(make_backend, ssh_hosts, tmp_path):
    sshd = ExtraSSHD(ssh_hosts, 0, 2223, tmp_path, replace={"MaxSessions 100": "MaxSessions 2"})
    backend = make_backend(ssh_hosts=[sshd.entry + "*6"], ssh_known_hosts=str(sshd.known_hosts),
                           ssh_when_full="fail")
    try:
        jobs = [backend.create_job(spec(SLEEP)) for _ in range(6)]
        for job in jobs:
            deadline = time.monotonic() + 30
            while "up" not in backend.logs(job):
                assert time.monotonic() < deadline and not backend.status(job).is_final
                time.sleep(0.05)
        # private read: the extra SSH sessions opened to the host (no API counts them)
        assert len(backend._hosts[0].conn._extra) >= 2  # 6 jobs, 2 sessions each
        for job in jobs:
            backend.terminate(job)
        for job in jobs:
            assert backend.wait(job, 30).state is JobState.CANCELLED
    finally:
        backend.close()
        sshd.stop()


def test_slow_and_noisy_login_shell(make_backend, ssh_hosts, tmp_path):
    """root's login shell is bash, which reads ~/.bashrc when sshd runs it: the server
    gives the sessions a home whose .bashrc prints noise and sleeps, like a heavy one
    (such as this machine's root one, with ``pyenv init``)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("echo 'noise from a login script'; printf 'no newline'; "
                                  "sleep 2\n")
    sshd = ExtraSSHD(ssh_hosts, 0, 2224, tmp_path,
                     replace={f"SetEnv HOME={ssh_hosts['dir']}/home": f"SetEnv HOME={home}"})
    backend = make_backend(ssh_hosts=[sshd.entry + "*4"], ssh_known_hosts=str(sshd.known_hosts),
                           ssh_start_timeout=0.5)
    try:
        backend.listen_address()  # connects and reads nproc/MemTotal through the noise
        assert backend._hosts[0].slots == 4 and backend._hosts[0].memory > 100
        started = time.monotonic()
        job = backend.create_job(spec("print('job output')"))
        assert time.monotonic() - started < 1.5
        assert backend.status(job).state is JobState.PENDING  # still in the login script
        status = backend.wait(job, 30)
        assert status.state is JobState.SUCCEEDED, backend.logs(job)
        assert backend.logs(job) == "job output\n"
        # a start error behind the noise is still a clear error (the timeout is long now)
        backend = make_backend(ssh_hosts=[sshd.entry + "*4"],
                               ssh_known_hosts=str(sshd.known_hosts))
        import pytest

        from fiber.backend import JobCreationError
        with pytest.raises(JobCreationError, match="does not exist there"):
            backend.create_job(JobSpec(command=["/nonexistent/python3"], labels=dict(LABELS)))
        # and one that is only seen after create returned fails the job with the reason
        slow = make_backend(ssh_hosts=[sshd.entry + "*4"],
                            ssh_known_hosts=str(sshd.known_hosts), ssh_start_timeout=0.5)
        job = slow.create_job(JobSpec(command=["/nonexistent/python3"], labels=dict(LABELS)))
        status = slow.wait(job, 30)
        assert status.state is JobState.FAILED and status.reason == "StartFailed"
        assert "does not exist there" in slow.logs(job)
    finally:
        backend.close()
        sshd.stop()
