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
