"""Helpers of the ssh backend's tests: the test-hosts script as a module, finding and
killing processes on the test hosts, cutting a host's link."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hosts_script = _load("fiber_ssh_test_hosts", ROOT / "scripts" / "engines" / "ssh" / "hosts.py")


def leftovers(state: dict[str, Any]) -> list[int]:
    """Processes in the hosts' namespaces other than the listening sshds."""
    listeners = set(state["sshd_pids"])
    return [pid for pid in hosts_script.pids_in_namespaces(state["namespaces"])
            if pid not in listeners]


def wait_no_leftovers(state: dict[str, Any], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    left = leftovers(state)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(state)
    return left


def fiber_jobs(state: dict[str, Any]) -> list[int]:
    """Job processes (fiber.runtime.bootstrap) still on the test hosts."""
    found = []
    for pid in leftovers(state):
        try:
            if b"fiber.runtime.bootstrap" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: " + Path(f"/proc/{pid}/cmdline").read_bytes()
                       .replace(b"\0", b" ").decode(errors="replace")[:200])
        except OSError:
            pass
    return out




def kill_host_processes(state: dict[str, Any], index: int) -> None:
    """Kill every process in host ``index``'s namespace except its listening sshd (they
    are all this test session's: the namespace was made for it)."""
    listeners = set(state["sshd_pids"])
    namespace = state["hosts"][index]["namespace"]
    for pid in hosts_script.pids_in_namespaces([namespace]):
        if pid not in listeners:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def set_link(state: dict[str, Any], index: int, up: bool) -> None:
    """Connect (``up``) or cut off host ``index`` by its veth on this machine."""
    veth = state["hosts"][index]["veth"]
    subprocess.run(["ip", "link", "set", veth, "up" if up else "down"], check=True)


class ExtraSSHD:
    """One more real sshd in host ``index``'s namespace, on ``port``, with settings
    replaced or added (for tests that need an unusual server); ``stop()`` ends it."""

    def __init__(self, state: dict[str, Any], index: int, port: int, tmp: Path,
                 replace: dict[str, str] | None = None, add: str = "") -> None:
        host = state["hosts"][index]
        hdir = Path(state["dir"], host["name"])
        config = (hdir / "sshd_config").read_text()
        config = config.replace(f"Port {host['port']}", f"Port {port}")
        config = config.replace(str(hdir / "sshd.pid"), str(tmp / "sshd.pid"))
        for old, new in (replace or {}).items():
            config = config.replace(old, new)
        (tmp / "sshd_config").write_text(config + add)
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text(f"[{host['address']}]:{port} {host['host_key']}\n")
        self.entry = f"root@{host['address']}:{port}"
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host['namespace']}", "/usr/sbin/sshd", "-D", "-e",
             "-f", str(tmp / "sshd_config")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                import socket

                socket.create_connection((host["address"], port), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the extra sshd did not start"
                time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
