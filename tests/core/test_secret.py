"""The run's secret travels apart from a job's environment (JobSpec.secrets) and is
never on a job's command line; a backend that does not say how it delivers it is
refused; the secrets file (the job-side mechanism any backend may use) is private,
read into the job's environment and removed.

The local backend's tests run real jobs. The tests of ``for_backend`` use two tiny
Backend subclasses that create no job (stand-ins for a backend's declaration only).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from fiber.backend import (
    SECRETS_FILE_ENV,
    Backend,
    Job,
    JobCreationError,
    JobSpec,
    JobStatus,
    SecretsFileError,
    load_secrets,
    read_secrets_file,
    write_secrets_file,
)
from fiber.backend.secrets import for_backend

SCRIPT = """
import os
import fiber
from fiber.backend import registry
from fiber.wire import auth

specs = []

def child(q, go):
    q.put(os.getpid())
    go.get()
    q.put("authenticated")

if __name__ == "__main__":
    key = auth.get_authkey().hex()
    backend = registry.get_backend("local", {"local_start_method": "%s"})
    create = backend.create_job
    def spy(spec):
        specs.append(spec)
        return create(spec)
    backend.create_job = spy
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=child, args=(q, go))
    p.start()
    pid = q.get(timeout=60)
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    print("job pid", pid == p.pid)
    print("key on cmdline", key.encode() in cmdline)
    print("key in spec secrets", specs[0].secrets.get("_FIBER_AUTHKEY") == key
          or specs[0].env.get("_FIBER_AUTHKEY") == key)
    go.put(1)
    print("child says", q.get(timeout=60))
    p.join(30)
    print("exitcode", p.exitcode)
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_local_job_gets_the_secret_but_not_on_its_command_line(run_script, method):
    done = run_script(SCRIPT % method, env={"FIBER_BACKEND": "local"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["job pid True", "key on cmdline False", "key in spec secrets True",
                     "child says authenticated", "exitcode 0"], done.stdout


class _Declares(Backend):
    """Only a declaration of secrets_delivery: it never creates a job."""

    name = "declares"

    def create_job(self, spec: JobSpec) -> Job:
        raise AssertionError("not used")

    def status(self, job: Job) -> JobStatus:
        raise AssertionError("not used")

    def terminate(self, job: Job, force: bool = False) -> None:
        raise AssertionError("not used")


class _Private(_Declares):
    secrets_delivery = "private"


class _Env(_Declares):
    secrets_delivery = "env"


SPEC = JobSpec(command=["true"], env={"A": "1"}, secrets={"_FIBER_AUTHKEY": "ab" * 32})


def test_a_private_backend_gets_the_secret_apart_from_the_environment():
    spec = for_backend(_Private({}), SPEC)
    assert spec.secrets == {"_FIBER_AUTHKEY": "ab" * 32}
    assert spec.env == {"A": "1"}
    assert "ab" * 32 not in repr(spec)  # a logged spec does not show it


def test_an_env_backend_gets_it_in_the_environment():
    spec = for_backend(_Env({}), SPEC)
    assert spec.secrets == {}
    assert spec.env == {"A": "1", "_FIBER_AUTHKEY": "ab" * 32}


def test_a_backend_that_does_not_deliver_secrets_is_refused():
    with pytest.raises(JobCreationError, match="does not say how it delivers"):
        for_backend(_Declares({}), SPEC)
    assert for_backend(_Declares({}), JobSpec(command=["true"])).env == {}  # no secret: fine


def test_secrets_file_is_private_read_into_the_environment_and_removed(tmp_path):
    path = str(tmp_path / "s")
    os.umask(old := os.umask(0))  # whatever the umask, the file is 0600
    try:
        write_secrets_file(path, {"_FIBER_AUTHKEY": "cd" * 32, "OTHER": "x=y"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_secrets_file(path) == {"_FIBER_AUTHKEY": "cd" * 32, "OTHER": "x=y"}
    with pytest.raises(FileExistsError):  # never over an existing file (or a symlink)
        write_secrets_file(path, {"A": "b"})
    env = {SECRETS_FILE_ENV: path, "KEEP": "1"}
    assert sorted(load_secrets(env)) == ["OTHER", "_FIBER_AUTHKEY"]
    assert env == {"KEEP": "1", "_FIBER_AUTHKEY": "cd" * 32, "OTHER": "x=y"}
    assert not os.path.exists(path)
    assert load_secrets({"KEEP": "1"}) == []
    with pytest.raises(ValueError):
        write_secrets_file(str(tmp_path / "t"), {"BAD": "a\nb"})
    assert not os.path.exists(tmp_path / "t")


def test_a_job_whose_secrets_file_is_missing_says_so_and_exits(tmp_path):
    env = {**os.environ, SECRETS_FILE_ENV: str(tmp_path / "missing"),
           "_FIBER_PARENT": "tcp://127.0.0.1:9", "_FIBER_CHANNEL": "1"}
    done = subprocess.run([sys.executable, "-m", "fiber.runtime.bootstrap"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot join its run" in done.stderr and "missing" in done.stderr
    with pytest.raises(SecretsFileError):
        read_secrets_file(str(tmp_path / "missing"))
