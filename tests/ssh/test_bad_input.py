"""Bad input gets a clear error that says what to do, against the real test hosts:
unknown or unreachable hosts, a refused key, unknown and mismatching host keys, a
missing Python or working directory, bad settings."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest

from fiber.backend import BackendError, ClusterUnreachableError, JobCreationError
from fiber.backend.job import JobSpec, JobState

LABELS = {"fiber.run": "bad-input", "fiber.parent": "test"}


def spec(code: str = "print('ok')", **fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", code], labels=dict(LABELS), **fields)


def first_host(state, slots: int = 2) -> str:
    host = state["hosts"][0]
    return f"root@{host['address']}:{host['port']}*{slots}"


def test_unresolvable_host_name(ssh_hosts, ssh_options):
    """The name lookup runs in a fresh, empty network namespace (``unshare --net``) so
    that no DNS query leaves this machine; the lookup fails there as it does for a name
    no resolver knows."""
    code = textwrap.dedent(f"""
        import sys
        from fiber.backend.job import JobSpec
        from fiber_ssh.backend import SSHBackend
        options = {{**{ssh_options!r}, "ssh_hosts": ["root@no-such-host.invalid:2222"]}}
        try:
            SSHBackend(options).create_job(JobSpec(command=[sys.executable, "-c", "1"]))
        except Exception as exc:
            print(type(exc).__name__, exc)
    """)
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("ClusterUnreachableError"), done.stdout + done.stderr
    assert "unknown SSH host 'no-such-host.invalid'" in done.stdout
    assert "FIBER_SSH_HOSTS" in done.stdout


def test_nothing_listening(make_backend, ssh_hosts):
    address = ssh_hosts["hosts"][0]["address"]
    backend = make_backend(ssh_hosts=[f"root@{address}:1"])
    with pytest.raises(ClusterUnreachableError, match="cannot connect to SSH host.*sshd runs"):
        backend.create_job(spec())


def test_one_bad_host_of_two_is_skipped(make_backend, ssh_hosts):
    address = ssh_hosts["hosts"][0]["address"]
    backend = make_backend(ssh_hosts=[f"root@{address}:1", first_host(ssh_hosts)])
    job = backend.create_job(spec())
    assert backend.wait(job, 30).state is JobState.SUCCEEDED


def test_refused_key(make_backend, ssh_hosts, tmp_path):
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)], ssh_key_file=str(key))
    with pytest.raises(ClusterUnreachableError, match="refused to log in.*authorized_keys"):
        backend.create_job(spec())


def test_missing_key_file(make_backend, ssh_hosts, tmp_path):
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)],
                           ssh_key_file=str(tmp_path / "nokey"))
    with pytest.raises(ClusterUnreachableError, match="key file .* does not exist"):
        backend.create_job(spec())


def test_unknown_host_key_is_rejected_by_default(make_backend, ssh_hosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)], ssh_known_hosts=str(empty))
    with pytest.raises(ClusterUnreachableError,
                       match="not in the known-hosts file.*FIBER_SSH_ACCEPT_UNKNOWN_HOSTS"):
        backend.create_job(spec())


def test_unknown_host_key_accepted_when_asked(make_backend, ssh_hosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)], ssh_known_hosts=str(empty),
                           ssh_accept_unknown_hosts=True)
    job = backend.create_job(spec())
    assert backend.wait(job, 30).state is JobState.SUCCEEDED
    assert empty.read_text() == ""  # accepting does not write the file


def test_host_key_mismatch(make_backend, ssh_hosts, tmp_path):
    h1, h2 = ssh_hosts["hosts"]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[{h1['address']}]:{h1['port']} {h2['host_key']}\n")
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)], ssh_known_hosts=str(wrong),
                           ssh_accept_unknown_hosts=True)
    with pytest.raises(ClusterUnreachableError, match="does NOT match.*ssh-keygen -R"):
        backend.create_job(spec())


def test_python_missing_on_the_host(make_backend, ssh_hosts):
    backend = make_backend()
    missing = f"/opt/no-python-{uuid.uuid4().hex[:6]}/bin/python3"
    bad = JobSpec(command=[missing, "-m", "fiber.runtime.bootstrap"], labels=dict(LABELS))
    with pytest.raises(JobCreationError, match="does not exist there.*same path on every host"):
        backend.create_job(bad)
    assert backend.list_jobs(LABELS) == []


def test_missing_working_directory(make_backend):
    backend = make_backend()
    with pytest.raises(JobCreationError, match="working directory.*FIBER_SSH_CWD"):
        backend.create_job(spec(cwd="/nonexistent/fiber-ssh-dir"))
    # ssh_cwd replaces the job's own working directory
    backend = make_backend(ssh_cwd="/tmp")
    job = backend.create_job(spec("import os; print(os.getcwd())", cwd="/nonexistent/dir"))
    assert backend.wait(job, 30).state is JobState.SUCCEEDED
    assert backend.logs(job).strip() == "/tmp"


def test_bad_environment_name(make_backend):
    backend = make_backend()
    with pytest.raises(JobCreationError, match="not valid in a shell"):
        backend.create_job(spec(env={"BAD-NAME": "1"}))


@pytest.mark.parametrize("entry", ["root@", "host:port", "h:99999", "h*0", "a b"])
def test_bad_host_entries(make_backend, entry):
    with pytest.raises(BackendError, match="SSH host"):
        make_backend(ssh_hosts=[entry])


def test_no_hosts_configured(make_backend):
    with pytest.raises(ClusterUnreachableError, match="FIBER_SSH_HOSTS"):
        make_backend(ssh_hosts=None, ssh_hosts_file=None)


def test_hosts_file_and_ssh_config_alias(make_backend, ssh_hosts, tmp_path):
    h1, h2 = ssh_hosts["hosts"]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {h1['address']}\n  IdentityFile {ssh_hosts['key_file']}\n"
                      f"Host second\n  HostName {h2['address']}\n  Port {h2['port']}\n"
                      f"  User root\n  IdentityFile {ssh_hosts['key_file']}\n")
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(f"# test hosts\nroot@{h1['address']}:{h1['port']}*1\nsecond*1\n")
    backend = make_backend(ssh_hosts=None, ssh_hosts_file=str(hosts_file),
                           ssh_config_file=str(config), ssh_key_file=None)
    jobs = [backend.create_job(spec("import socket; print(socket.gethostname())"))
            for _ in range(2)]
    for job in jobs:
        assert backend.wait(job, 30).state is JobState.SUCCEEDED
    assert sorted(backend.logs(job).strip() for job in jobs) == ["h1", "h2"]
    assert jobs[1].host == "second" or jobs[0].host == "second"


def test_no_key_at_all(make_backend, ssh_hosts, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* keys
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    backend = make_backend(ssh_hosts=[first_host(ssh_hosts)], ssh_key_file=None)
    with pytest.raises(ClusterUnreachableError, match="no key to log in.*FIBER_SSH_KEY_FILE"):
        backend.create_job(spec())


def test_missing_hosts_file(make_backend, tmp_path):
    with pytest.raises(ClusterUnreachableError, match="cannot read the SSH hosts file"):
        make_backend(ssh_hosts=None, ssh_hosts_file=str(tmp_path / "none"))


def test_a_job_whose_wrapper_never_starts_is_ended_by_a_forced_terminate(
        make_backend, monkeypatch):
    """A wrapper that never reports a pid (here its environment never ends: the
    backend's env script is replaced, the one faked part; the host, sshd and wrapper
    are real) stays PENDING; terminate(force=True) closes its channel, so it ends
    instead of staying on the host for ever (make_backend checks the hosts after)."""
    from fiber_ssh import remote

    monkeypatch.setattr(remote, "env_script", lambda env, end="": "export A=1\n")
    backend = make_backend(ssh_start_timeout=1)
    job = backend.create_job(JobSpec(command=["true"], labels=LABELS))
    assert backend.status(job).state is JobState.PENDING
    backend.terminate(job, force=True)
    final = backend.wait(job, 30)
    assert final is not None and final.is_final, final
    backend.release(job)
