"""Every connection must prove it holds the run's secret before anything it sends is
unpickled; a rogue client is rejected and nothing it sent runs."""

from __future__ import annotations

import os
import pickle
import struct

import pynng
import pytest

import fiber
from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import transport


class _Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _echo_queue(q, out):
    out.put(q.get() + 1)


def test_rogue_client_is_rejected_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    q = fiber.Queue()
    # private read: a rogue client needs the queue's raw address and channel, which a queue never
    # shows (it pickles them only in its authenticated form)
    address = q._endpoint.address
    cid = q._endpoint.cid
    payload = pickle.dumps(_Exploit(str(marker)))
    # 1. a raw pickle without any handshake
    rogue = pynng.Req0(dial=address, recv_timeout=3000)
    rogue.send(b"M" + struct.pack("<Q", cid) + struct.pack("<cd", b"P", 0.0) + payload)
    try:
        reply = rogue.recv()
        assert reply[:1] == transport.ERROR
    except (pynng.Timeout, pynng.Closed, pynng.ConnectionReset):
        pass  # the hub closed the connection
    rogue.close()
    # 2. a handshake answered with a wrong secret
    with pytest.raises((AuthenticationError, ConnectionLostError)):
        transport.Client(address, authkey=b"not the run's secret")
    assert not marker.exists()
    assert q.qsize() == 0
    # the hub still serves authenticated processes
    out = fiber.Queue()
    p = fiber.Process(target=_echo_queue, args=(q, out))
    p.start()
    q.put(41)
    assert out.get(timeout=60) == 42
    p.join(30)
    assert not marker.exists()


def test_child_gets_secret_only_through_its_environment():
    key = fiber.current_process().authkey
    assert isinstance(key, bytes) and len(key) == 32
    assert os.environ.get("_FIBER_AUTHKEY") in (None, key.hex())


def _task_child_sees_secret() -> bool:
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c",
                          "import os; print('_FIBER_AUTHKEY' in os.environ)"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip() == "True"


def test_programs_a_task_starts_do_not_inherit_the_secret():
    """A job takes the run's secret out of its environment once read: a shell command
    or simulator its task starts does not carry it (in /proc/PID/environ)."""
    with fiber.Pool(1) as pool:
        assert pool.apply(_task_child_sees_secret) is False
    q = fiber.Queue()
    p = fiber.Process(target=lambda: q.put(_task_child_sees_secret()))
    p.start()
    assert q.get(timeout=60) is False
    p.join(30)


@pytest.mark.parametrize("squat", ["mode", "owner"])
def test_a_status_directory_that_is_not_private_is_refused_loudly(tmp_path, squat):
    """Someone made the user's status directory before the user did (mode 0777, or
    owned by another user): a program does not register there, with a warning, and
    `fiber top` says why it cannot look and where."""
    import subprocess
    import sys

    path = tmp_path / f"fiber-status-{os.getuid()}"
    path.mkdir()
    if squat == "mode":
        path.chmod(0o777)
    else:
        os.chown(path, 65534, 65534)
        path.chmod(0o755)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    program = ("import fiber\n"
               "if __name__ == '__main__':\n"
               "    with fiber.Pool(1) as pool:\n"
               "        print(pool.apply(abs, (-3,)))\n")
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "3", run.stderr
    assert str(path) in run.stderr and "not a directory private to this user" in run.stderr
    assert os.listdir(path) == []  # nothing written there
    top = subprocess.run([sys.executable, "-m", "fiber", "top", "--list"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert top.returncode == 1
    assert str(path) in top.stderr and "not a directory private to this user" in top.stderr
    assert ("lets other users in" if squat == "mode" else "belongs to user id 65534") \
        in top.stderr
