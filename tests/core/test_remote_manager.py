"""multiprocessing's documented "Using a remote manager" example, run as it is written:
a server program (``BaseManager(address=(host, port), authkey=...)`` and
``get_server().serve_forever()``) and two other programs that ``connect()`` with the
same authkey, one putting into the served queue and one getting from it. Under
multiprocessing and under fiber (local backend), the same output. Real programs, real
sockets; every step bounded.

Before, fiber's managers ignored an authkey they were given (their server checked the
run's secret instead), so a manager with an authkey could not be used at all, by
another program or by itself."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "remote_manager"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int, server: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, "the server program ended"
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.1)


@pytest.mark.parametrize("module", ["mp", "fiber"])
def test_the_documented_remote_manager_example_runs(module):
    port = _free_port()
    env = dict(os.environ, FIBER_BACKEND="local")
    server = subprocess.Popen([sys.executable, str(HERE / "server.py"), module, str(port)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        _wait_listening(port, server)
        outputs = []
        for verb in ("put", "get"):
            done = subprocess.run(
                [sys.executable, str(HERE / "client.py"), module, str(port), verb],
                env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, (verb, done.stderr)
            outputs.append(done.stdout.strip())
        assert outputs == ["put", "got hello"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)


def test_a_manager_with_an_authkey_serves_its_own_proxies(run_script):
    """In one program: a started manager given an authkey, its own proxies, and a
    second manager object connecting to it with that key (both failed before)."""
    result = run_script("""
        from fiber.managers import BaseManager

        class M(BaseManager):
            pass

        M.register("echo", callable=lambda x=1: x)

        if __name__ == "__main__":
            m = M(address=("127.0.0.1", 0), authkey=b"abc")
            m.start()
            other = M(address=m.address, authkey=b"abc")
            other.connect()
            print(m.echo(5), other.echo(6))
            m.shutdown()
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5", "6"]


def test_a_manager_started_at_every_address_reports_a_reachable_one(run_script):
    """``address=('', port)``, as the documentation's server binds: the server job
    listens on every address of its host and the manager's ``address`` is the one its
    job is reached at (the local backend's 127.0.0.1), which its own proxies and other
    programs use; multiprocessing reports 0.0.0.0, which names the program's own
    machine (tests/ssh/test_remote_manager.py: a job on another host). Before, fiber
    reported 0.0.0.0 too."""
    result = run_script("""
        import socket
        from fiber.managers import BaseManager

        class M(BaseManager):
            pass

        M.register("echo", callable=lambda x=1: x)

        if __name__ == "__main__":
            m = M(address=("", 0), authkey=b"abc")
            m.start()
            host, port = m.address
            print(host, m.echo(5))
            other = M(address=("127.0.0.1", port), authkey=b"abc")
            other.connect()
            print(other.echo(6))
            m.shutdown()
    """, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["127.0.0.1", "5", "6"]
