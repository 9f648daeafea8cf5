"""multiprocessing's documented "Using a remote manager" example where the cluster
matters, on the real SSH test hosts (network namespaces with their own sshd, started
by conftest):

- the server program's manager is a fiber job on an SSH host (``m.start()`` under the
  ssh backend), listening at ``(that host's address, port)`` or, as the documentation
  writes it, ``('', port)``; client programs on this machine ``connect()`` with the
  authkey, one puts into the served queue and one gets;
- a server program on this machine (``get_server().serve_forever()`` at ``('', port)``)
  is reached by a fiber Process running on an SSH host, which puts into its queue; a
  client program here gets what it put.

Each prints what the same programs print under multiprocessing on this machine. Real
programs, real sockets, every step bounded; nothing is left on the hosts.

Before: a manager started at ``('', port)`` reported ``0.0.0.0`` as its address, so
its own proxies and ``m.address`` pointed at this machine, where nothing listened."""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from ssh_helpers import ROOT, describe, wait_no_leftovers

HERE = Path(__file__).parent / "remote_manager"
CORE = ROOT / "tests" / "core" / "remote_manager"
TIMEOUT = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class _Lines:
    """The lines a program prints, read by a thread, each awaited with a deadline."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next(self, timeout: float = TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout}s") from None
        assert line is not None, \
            f"the program ended: {self.proc.wait(10)} {self.proc.stderr.read()[-3000:]}"
        return line


def _clients(host: str, port: int, module: str, env: dict[str, str]) -> list[str]:
    """Run the documented client program twice on this machine: put, then get."""
    outputs = []
    for verb in ("put", "get"):
        done = subprocess.run(
            [sys.executable, str(CORE / "client.py"), module, str(port), verb, host],
            env=env, capture_output=True, text=True, timeout=TIMEOUT,
            stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (verb, done.stderr[-3000:])
        outputs.append(done.stdout.strip())
    return outputs


def _listening_in(namespace: str, port: int) -> bool:
    done = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hltn",
                           f"sport = :{port}"], capture_output=True, text=True, timeout=30)
    return str(port) in done.stdout


def _started_server(module: str, host: str, env: dict[str, str],
                    namespaces: Sequence[str] = ()
                    ) -> tuple[list[str], list[str], list[str], tuple[str, int]]:
    """Run start_server.py at ``(host, port)`` and the two clients against the address
    it reports: (its lines, the clients' lines, which of the hosts' ``namespaces`` it
    listened in, that address)."""
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(HERE / "start_server.py"), module, host,
                               str(port)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        out = _Lines(server)
        lines = [out.next()]
        where = out.next().split()
        address = (where[0], int(where[1]))
        assert address[1] == port, where
        listening = [ns for ns in namespaces if _listening_in(ns, port)]
        outputs = _clients(address[0], port, module, env)
        server.stdin.close()
        lines.append(out.next())
        assert server.wait(60) == 0, server.stderr.read()[-3000:]
        return lines, outputs, listening, address
    finally:
        _stop(server)


def _documented_output(host: str) -> tuple[list[str], list[str]]:
    """What the same programs print under multiprocessing on this machine."""
    env = dict(os.environ)
    lines, outputs, _, _ = _started_server("mp", host, env)
    return lines, outputs


@pytest.mark.parametrize("bind", ["host", "any"])
def test_a_manager_started_on_an_ssh_host_serves_programs_here(ssh_hosts, bind):
    """``bind="host"``: the run has one host (h1) and the manager's address is h1's;
    ``"any"``: both hosts, address ``('', port)``, the manager reports the address of
    the host its job runs on."""
    h1 = ssh_hosts["hosts"][0]
    env = dict(os.environ, FIBER_BACKEND="ssh")
    if bind == "host":
        env["FIBER_SSH_HOSTS"] = os.environ["FIBER_SSH_HOSTS"].split(",")[0]
        assert h1["address"] in env["FIBER_SSH_HOSTS"]
    host = h1["address"] if bind == "host" else ""
    try:
        lines, outputs, listening, address = _started_server("fiber", host, env,
                                                             ssh_hosts["namespaces"])
        expected_lines, expected_outputs = _documented_output(
            "127.0.0.1" if bind == "host" else "")
        assert (lines, outputs) == (expected_lines, expected_outputs)
        assert (lines, outputs) == (["serving", "shut down"], ["put", "got hello"])
        # the server was a job on a test host, at that host's address
        by_address = {h["address"]: h["namespace"] for h in ssh_hosts["hosts"]}
        assert address[0] in by_address, address
        assert listening == [by_address[address[0]]], (address, listening)
        if bind == "host":
            assert address[0] == h1["address"]
    finally:
        left = wait_no_leftovers(ssh_hosts)
    assert not left, f"processes left on the test hosts: {describe(left)}"


def test_a_process_on_an_ssh_host_puts_into_a_manager_served_here(ssh_hosts):
    """The server program serves on this machine at ``('', port)``; a fiber Process
    on an SSH host connects to this machine's address on the hosts' network and puts;
    a client program here gets."""
    here = ssh_hosts["local_address"]

    def run(module: str, env: dict[str, str]) -> tuple[list[str], str]:
        port = _free_port()
        server = subprocess.Popen([sys.executable, str(CORE / "server.py"), module,
                                   str(port), ""], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            assert _Lines(server).next() == "serving"
            done = subprocess.run(
                [sys.executable, str(HERE / "remote_put.py"), module, here, str(port)],
                env=env, capture_output=True, text=True, timeout=TIMEOUT,
                stdin=subprocess.DEVNULL)
            assert done.returncode == 0, done.stderr[-3000:]
            got = subprocess.run(
                [sys.executable, str(CORE / "client.py"), module, str(port), "get"],
                env=env, capture_output=True, text=True, timeout=TIMEOUT,
                stdin=subprocess.DEVNULL)
            assert got.returncode == 0, got.stderr[-3000:]
            return done.stdout.splitlines() + [got.stdout.strip()], done.stderr
        finally:
            _stop(server)

    try:
        fiber_lines, stderr = run("fiber", dict(os.environ, FIBER_BACKEND="ssh"))
        mp_lines, _ = run("mp", dict(os.environ))
        ran_on = {h["name"] for h in ssh_hosts["hosts"]}
        assert len(fiber_lines) == 3, (fiber_lines, stderr[-3000:])
        # the same lines, but for the host the process ran on: an SSH host under fiber
        assert mp_lines == [f"put on {socket.gethostname()}", "exitcode 0", "got hello"]
        assert fiber_lines[0].split()[:2] == ["put", "on"], fiber_lines
        assert fiber_lines[0].split()[2] in ran_on, fiber_lines
        assert fiber_lines[1:] == mp_lines[1:]
    finally:
        left = wait_no_leftovers(ssh_hosts)
    assert not left, f"processes left on the test hosts: {describe(left)}"


def test_a_manager_at_an_address_its_host_lacks_fails_at_once(ssh_hosts):
    """The run's only host is h2 and the manager's address is h1's: the server job
    cannot bind it, and ``start()`` raises ProcessError within seconds (the job's
    error on its output), never a hang."""
    h1, h2 = ssh_hosts["hosts"][:2]
    env = dict(os.environ, FIBER_BACKEND="ssh",
               FIBER_SSH_HOSTS=os.environ["FIBER_SSH_HOSTS"].split(",")[1])
    assert h2["address"] in env["FIBER_SSH_HOSTS"]
    try:
        started = time.monotonic()
        done = subprocess.run([sys.executable, str(HERE / "start_server.py"), "fiber",
                               h1["address"], str(_free_port())], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT,
                              stdin=subprocess.DEVNULL)
        elapsed = time.monotonic() - started
        assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
        assert "serving" not in done.stdout
        assert "ProcessError: the server of QueueManager ended" in done.stderr, done.stderr
        assert "Cannot assign requested address" in done.stderr, done.stderr
        assert elapsed < 60, elapsed
    finally:
        left = wait_no_leftovers(ssh_hosts)
    assert not left, f"processes left on the test hosts: {describe(left)}"
