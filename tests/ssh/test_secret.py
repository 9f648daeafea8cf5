"""The run's secret on the real SSH test hosts: a fiber Process that authenticated to
its parent (it answers through a Queue) holds it, yet no command line on the host shows
it (`ps -eo args`, which every user of a host can run) and no file written under the
host's temporary directories since the job started contains it. (The test hosts are
network namespaces of this machine: their processes and files are this machine's.)"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time

import fiber
from fiber.wire import auth

_TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _report(q, go):
    # the job holds the run's secret, and took it out of its environment once read (so
    # the programs its tasks start do not inherit it)
    key = ("still in the environment" if "_FIBER_AUTHKEY" in os.environ
           else auth.get_authkey().hex())
    q.put(hashlib.sha256(key.encode()).hexdigest())
    go.get()
    q.put("authenticated")


def _files_holding(needle: bytes, since: float) -> list[str]:
    found = []
    for top in _TMP_DIRS:
        for root, _, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                    if (not os.path.isfile(path) or os.path.islink(path)
                            or st.st_mtime < since or st.st_size > (4 << 20)):
                        continue
                    with open(path, "rb") as f:
                        if needle in f.read():
                            found.append(path)
                except OSError:
                    continue
    return found


def test_no_onlooker_on_the_host_sees_the_secret(ssh_fiber, ssh_hosts):
    key = auth.get_authkey().hex()
    since = time.time() - 1
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=_report, args=(q, go), name="secret-holder")
    p.start()
    try:
        assert q.get(timeout=120) == hashlib.sha256(key.encode()).hexdigest()
        assert p.job.backend == "ssh"
        args = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True,
                              check=True).stdout
        assert "fiber.runtime.bootstrap" in args  # the job is there, and shown
        assert key not in args
        assert _files_holding(key.encode(), since) == []
        go.put(1)
        assert q.get(timeout=60) == "authenticated"
    finally:
        p.join(60)
    assert p.exitcode == 0
