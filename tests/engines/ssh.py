"""Test engine of the ssh backend: two real SSH hosts on this machine.

``start()`` installs OpenSSH/iproute2/iptables if missing (scripts/engines/ssh/install.sh)
and runs ``scripts/engines/ssh/hosts.py up``: two network namespaces (hostnames h1 and
h2, addresses 127.10.0.34 and .35) joined by a bridge that carries this machine's
address 127.10.0.33 (or the next free 127.10.0.x/28 when another session holds those),
each with its own sshd on port 2222, a fresh host key, a client key
and a known-hosts file (so the default "reject unknown host keys" policy is what the
tests use). It returns the FIBER_SSH_* settings, plus ``FSSH_TEST_STATE`` (the state
file the tests in tests/ssh read). ``stop()`` runs ``hosts.py down``: kills every process
left in the namespaces and the sshds by pid, deletes namespaces, bridge and the iptables
rule it added, and removes the temp dir. ``FSSH_TEST_NET`` forces a /28 subnet (with prefix ``fssh-``).
``FSSH_TEST_HOSTS`` sets the number of hosts (default 2, at most 13 in a /28) and
``FSSH_TEST_SLOTS`` the slots of each (default 16): the benchmark's scale rows spread 256
workers over 8 hosts (``FSSH_TEST_HOSTS=8 FSSH_TEST_SLOTS=40``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "engines" / "ssh"
SLOTS = 16  # per host: 16 pool workers plus a manager fit at once (jobs mostly sleep)
HOSTS = 2

_state_dir: str | None = None


def start() -> dict[str, str]:
    global _state_dir
    if os.geteuid() != 0:
        raise RuntimeError("the ssh test hosts need root (network namespaces, sshd)")
    subprocess.run(["sh", str(SCRIPTS / "install.sh")], check=True, stdin=subprocess.DEVNULL)
    _state_dir = tempfile.mkdtemp(prefix="fiber-ssh-hosts-")
    argv = [sys.executable, str(SCRIPTS / "hosts.py"), "up", "--dir", _state_dir, "--count",
            os.environ.get("FSSH_TEST_HOSTS", str(HOSTS)),
            "--owner", str(os.getpid())]
    if os.environ.get("FSSH_TEST_NET"):
        argv += ["--net", os.environ["FSSH_TEST_NET"], "--prefix", "fssh-"]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        _state_dir = None
        raise RuntimeError(f"cannot start the ssh test hosts: {done.stderr.strip()}")
    state = json.loads(done.stdout)
    return {
        "FIBER_SSH_HOSTS": ",".join(f"root@{h['address']}:{h['port']}*"
                                    f"{os.environ.get('FSSH_TEST_SLOTS', SLOTS)}"
                                    for h in state["hosts"]),
        "FIBER_SSH_KEY_FILE": state["key_file"],
        "FIBER_SSH_KNOWN_HOSTS": state["known_hosts"],
        "FIBER_SSH_KEEPALIVE": "1",
        "FIBER_SSH_DEAD_AFTER": "4",
        "FSSH_TEST_STATE": str(Path(_state_dir) / "state.json"),
    }


def stop() -> None:
    global _state_dir
    if _state_dir is None:
        return
    subprocess.run([sys.executable, str(SCRIPTS / "hosts.py"), "down", "--dir", _state_dir],
                   check=False, stdin=subprocess.DEVNULL)
    _state_dir = None


# -- an outage (the fault tests and bench/faults.py) ----------------------------------
def _set_link(index: int, up: bool) -> None:
    state = json.loads(Path(os.environ["FSSH_TEST_STATE"]).read_text())
    subprocess.run(["ip", "link", "set", state["hosts"][index]["veth"], "up" if up else "down"],
                   check=True, stdin=subprocess.DEVNULL)


def freeze() -> None:
    """Cut the last test host off the network (its veth on this machine set down): the
    whole host, its sshd and its jobs, unreachable. ``thaw()`` connects it again."""
    _set_link(-1, up=False)


def thaw() -> None:
    _set_link(-1, up=True)
