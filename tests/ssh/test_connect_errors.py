"""The SSH rows of docs/backend-errors.md, against the real sshd hosts of the test engine
(tests/engines/ssh.py), through the core's retry (fiber.runtime.retry.call, as
``Process.start`` calls it): a host whose sshd is not up yet (connection refused) or
does not answer (connection timed out) is tried again and the job runs; a refused login
or a wrong or unknown host key fails at once, whatever the retry budget.

The faults are real: a second sshd of host h1 (ssh_helpers.ExtraSSHD) on a port of its
own that it starts listening on 1.5 s late (refused until then), and an iptables DROP
rule for that port in h1's network namespace for 3 s (timed out).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from ssh_helpers import ExtraSSHD

from fiber.backend import ClusterUnreachableError, JobSpec, JobState
from fiber.runtime import retry

LABELS = {"fiber.run": "connect-errors", "fiber.parent": "test"}
BUDGET = 15.0  # the retry budget of these tests: what "at once" is measured against


def _spec() -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", "print('ok')"], labels=dict(LABELS),
                   name="connect-row")


def _create(backend) -> tuple[object, float]:
    began = time.monotonic()
    job = retry.call("ssh", "create a job", lambda: backend.create_job(_spec()), BUDGET)
    return job, time.monotonic() - began


def _fails_at_once(backend, match: str) -> ClusterUnreachableError:
    began = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match=match) as caught:
        _create(backend)
    elapsed = time.monotonic() - began
    assert elapsed < 5, f"failed after {elapsed:.1f} s of retries"
    assert caught.value.transient is False
    return caught.value


def test_refused_connection_is_retried(make_backend, ssh_hosts, tmp_path):
    host = ssh_hosts["hosts"][0]
    port = 2231
    tmp_path.joinpath("known_hosts").write_text(f"[{host['address']}]:{port} "
                                                f"{host['host_key']}\n")
    started: list[ExtraSSHD] = []

    def sshd_up_late() -> None:
        time.sleep(1.5)
        started.append(ExtraSSHD(ssh_hosts, 0, port, tmp_path))

    backend = make_backend(ssh_hosts=[f"root@{host['address']}:{port}*2"],
                           ssh_known_hosts=str(tmp_path / "known_hosts"))
    thread = threading.Thread(target=sshd_up_late)
    thread.start()
    try:
        job, elapsed = _create(backend)
        assert elapsed >= 1.5  # refused first, then retried
        assert backend.wait(job, 30).state is JobState.SUCCEEDED
    finally:
        thread.join()
        backend.close()
        for sshd in started:
            sshd.stop()


def test_timed_out_connection_is_retried(make_backend, ssh_hosts, tmp_path):
    host = ssh_hosts["hosts"][0]
    port = 2232
    sshd = ExtraSSHD(ssh_hosts, 0, port, tmp_path)
    rule = ["INPUT", "-p", "tcp", "--dport", str(port), "-j", "DROP"]
    in_host = ["ip", "netns", "exec", host["namespace"], "iptables"]
    subprocess.run([*in_host, "-I", *rule], check=True)
    lift = threading.Timer(3.0, subprocess.run, args=([*in_host, "-D", *rule],))
    backend = make_backend(ssh_hosts=[f"{sshd.entry}*2"],
                           ssh_known_hosts=str(sshd.known_hosts), ssh_connect_timeout=1)
    lift.start()
    try:
        job, elapsed = _create(backend)
        assert elapsed >= 2.5  # timed out first, then retried
        assert backend.wait(job, 30).state is JobState.SUCCEEDED
    finally:
        lift.join()
        subprocess.run([*in_host, "-D", *rule], capture_output=True)  # if still there
        backend.close()
        sshd.stop()


def test_refused_login_fails_at_once(make_backend, ssh_hosts, tmp_path):
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host = ssh_hosts["hosts"][0]
    backend = make_backend(ssh_hosts=[f"root@{host['address']}:{host['port']}*2"],
                           ssh_key_file=str(key))
    _fails_at_once(backend, "refused to log in.*authorized_keys")


def test_wrong_host_key_fails_at_once(make_backend, ssh_hosts, tmp_path):
    h1, h2 = ssh_hosts["hosts"]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[{h1['address']}]:{h1['port']} {h2['host_key']}\n")
    backend = make_backend(ssh_hosts=[f"root@{h1['address']}:{h1['port']}*2"],
                           ssh_known_hosts=str(wrong))
    _fails_at_once(backend, "does NOT match.*ssh-keygen -R")


def test_unknown_host_key_fails_at_once(make_backend, ssh_hosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    host = ssh_hosts["hosts"][0]
    backend = make_backend(ssh_hosts=[f"root@{host['address']}:{host['port']}*2"],
                           ssh_known_hosts=str(empty))
    _fails_at_once(backend, "not in the known-hosts file")
