"""The job's environment on the real hosts: awkward values arrive intact, and the
values never appear on any command line on the host (they travel on stdin)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

from ssh_helpers import hosts_script

from fiber.backend.job import JobSpec, JobState

LABELS = {"fiber.run": "env", "fiber.parent": "test"}

AWKWARD = {
    "QUOTES": "it's \"quoted\" `cmd` $(cmd) $HOME \\ back",
    "NEWLINES": "line1\nline2\n\nFIBER-SSH-ENV-END-0000\n",
    "SPACES": "  leading and trailing  ",
    "EMPTY": "",
    "UNICODE": "héllo ✓",
}


def test_awkward_values_arrive_intact(make_backend):
    backend = make_backend()
    code = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
            f"{sorted(AWKWARD)!r}}}))")
    job = backend.create_job(JobSpec(command=[sys.executable, "-c", code], env=AWKWARD,
                                     labels=dict(LABELS)))
    assert backend.wait(job, 30).state is JobState.SUCCEEDED, backend.logs(job)
    assert json.loads(backend.logs(job)) == AWKWARD


def test_secret_is_not_on_any_command_line(make_backend, ssh_hosts):
    backend = make_backend()
    secret = "s3cr3t-" + uuid.uuid4().hex
    job = backend.create_job(JobSpec(
        command=[sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        env={"FIBER_TEST_SECRET": secret}, labels=dict(LABELS)))
    deadline = time.monotonic() + 30
    while "up" not in backend.logs(job):
        assert time.monotonic() < deadline, backend.logs(job)
        time.sleep(0.05)
    pids = hosts_script.pids_in_namespaces(ssh_hosts["namespaces"])
    in_environ = []
    for pid in pids:
        try:
            assert secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            if secret.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                in_environ.append(pid)
        except FileNotFoundError:
            continue
    assert in_environ  # it is in the job's (and its signal relay's) environment only
    backend.terminate(job)
    assert backend.wait(job, 30).state is JobState.CANCELLED
