"""More jobs on a host than its sshd allows sessions per connection (``MaxSessions``,
10 by default in OpenSSH): the backend opens further connections to that host. Uses an
extra real sshd with ``MaxSessions 2`` in host h1's namespace."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fiber.job import JobSpec, JobState

SLEEP = "import time; print('up', flush=True); time.sleep(600)"


def test_session_limit_opens_more_connections(make_backend, ssh_hosts, tmp_path):
    h1 = ssh_hosts["hosts"][0]
    config = Path(ssh_hosts["dir"], "h1", "sshd_config").read_text()
    config = config.replace(f"Port {h1['port']}", "Port 2223")
    config = config.replace("MaxSessions 100", "MaxSessions 2")
    config = config.replace(str(Path(ssh_hosts["dir"], "h1", "sshd.pid")),
                            str(tmp_path / "sshd.pid"))
    (tmp_path / "sshd_config").write_text(config)
    known = tmp_path / "known_hosts"
    known.write_text(f"[{h1['address']}]:2223 {h1['host_key']}\n")
    sshd = subprocess.Popen(["nsenter", f"--net=/run/netns/{h1['namespace']}", "/usr/sbin/sshd",
                             "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    backend = make_backend(ssh_hosts=[f"root@{h1['address']}:2223*6"],
                           ssh_known_hosts=str(known), ssh_when_full="fail")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                backend.listen_address()
                break
            except Exception:  # noqa: BLE001 -- sshd still starting
                assert time.monotonic() < deadline, "the extra sshd did not start"
                backend.close()
                backend = make_backend(ssh_hosts=[f"root@{h1['address']}:2223*6"],
                                       ssh_known_hosts=str(known), ssh_when_full="fail")
                time.sleep(0.2)
        labels = {"fiber.run": "sessions", "fiber.parent": "test"}
        jobs = [backend.create_job(JobSpec(command=[sys.executable, "-c", SLEEP],
                                           labels=labels)) for _ in range(6)]
        for job in jobs:
            deadline = time.monotonic() + 30
            while "up" not in backend.logs(job):
                assert time.monotonic() < deadline and not backend.status(job).is_final
                time.sleep(0.05)
        assert len(backend._hosts[0].conn._extra) >= 2  # 6 jobs, 2 sessions each
        for job in jobs:
            backend.terminate(job)
        for job in jobs:
            assert backend.wait(job, 30).state is JobState.CANCELLED
    finally:
        backend.close()
        sshd.terminate()
        sshd.wait(10)
