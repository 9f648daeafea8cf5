"""The mutual handshake (fiber.wire.handshake): its two halves against each other in
memory, then on both wires of a real hub on loopback, with what the hub logs: a wrong
proof is a warning naming the peer's address, a connection that drops mid-handshake
(a process that exits while it connects) is only a debug line, a silent one is closed
after its time is up."""

from __future__ import annotations

import logging
import os
import socket
import time

import pynng
import pytest

from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import auth, transport
from fiber.wire import hub as hub_module
from fiber.wire.handshake import HubHandshake, prove
from fiber.wire.nng_client import Client
from fiber.wire.protocol import AUTH1, AUTH3, AUTH_REFUSED, CLIENT_ROLE, NONCE_SIZE, OK
from fiber.wire.stream import framing
from fiber.wire.stream import server as stream_server
from fiber.wire.stream.client import StreamClient

KEY = b"k" * 32
OTHER = b"o" * 32


# -- the two halves, in memory ----------------------------------------------------------
def test_same_secret_accepted():
    hs = HubHandshake(KEY, "peer")
    prove(KEY, hs.step, "hub")
    assert hs.accepted and hs.refused is None


@pytest.mark.parametrize(("client_key", "hub_key"), [(OTHER, KEY), (KEY, OTHER)])
def test_a_client_that_finds_the_hub_wrong_stops_before_its_proof(client_key, hub_key):
    hs = HubHandshake(hub_key, "peer")
    with pytest.raises(AuthenticationError, match="does not hold"):
        prove(client_key, hs.step, "hub")
    # the client did not answer the hub's challenge: for the hub it just went away
    assert hs.started and not hs.accepted and hs.refused is None


def test_a_wrong_proof_is_refused_and_logged_with_the_peer(caplog):
    caplog.set_level(logging.DEBUG, logger="fiber")
    hs = HubHandshake(KEY, "10.1.2.3:4567")
    reply = hs.step(AUTH1 + os.urandom(NONCE_SIZE))
    assert reply[:1] == OK and len(reply) == 1 + NONCE_SIZE + 32
    assert hs.step(AUTH3 + auth.answer(OTHER, CLIENT_ROLE, reply[1:1 + NONCE_SIZE])) \
        == AUTH_REFUSED
    assert not hs.accepted and hs.refused == "a wrong proof of the run's secret"
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "10.1.2.3:4567" in record.getMessage()
    assert "wrong proof" in record.getMessage()


@pytest.mark.parametrize("first", [b"M" + b"\0" * 40, AUTH1 + b"short", AUTH3 + b"x" * 32, b""])
def test_anything_but_a_handshake_is_refused(first):
    hs = HubHandshake(KEY, "peer")
    assert hs.step(first) == AUTH_REFUSED
    assert hs.refused and not hs.accepted
    assert hs.step(AUTH1 + os.urandom(NONCE_SIZE)) == AUTH_REFUSED  # and stays refused


def test_a_refusing_hub_makes_the_client_raise():
    def exchange(message: bytes) -> bytes:
        hs_reply = hub.step(message)
        return AUTH_REFUSED if message[:2] == AUTH3 else hs_reply

    hub = HubHandshake(KEY, "peer")
    with pytest.raises(AuthenticationError, match="rejected"):
        prove(KEY, exchange, "hub")


# -- on the wires ------------------------------------------------------------------------
@pytest.fixture()
def hub():
    h = transport.Hub("127.0.0.1")
    yield h
    h.close()


def _records(caplog, level: int, needle: str, timeout: float = 10.0) -> list[str]:
    """Messages of the fiber logger at ``level`` containing ``needle`` (waiting up to
    ``timeout`` for the first: the hub logs from its own threads)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [r.getMessage() for r in caplog.records
                 if r.name == "fiber" and r.levelno == level and needle in r.getMessage()]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


class _RawStream:
    """A stream connection that speaks the handshake by hand."""

    def __init__(self, address: str, local: bool) -> None:
        host, port, name = framing.split_address(address)
        self.sock = framing.connect(host, port, name if local else None, 10)
        assert self.sock.family == (socket.AF_UNIX if local else socket.AF_INET)

    def exchange(self, message: bytes) -> bytes:
        self.sock.sendall(framing.frame(0, message))
        got = framing.read_frame_blocking(self.sock, 1024)
        assert got is not None
        return got[1]

    def name(self) -> str:
        if self.sock.family == socket.AF_UNIX:
            return f"pid {os.getpid()}"
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.sock.close()


class _RawNng:
    """An nng connection that speaks the handshake by hand."""

    def __init__(self, address: str) -> None:
        self.sock = pynng.Req0(dial=address, recv_timeout=10_000)

    def exchange(self, message: bytes) -> bytes:
        self.sock.send(message)
        return self.sock.recv()

    def name(self) -> str:
        deadline = time.monotonic() + 10
        while not self.sock.pipes:  # dialled in the background
            assert time.monotonic() < deadline, "not connected"
            time.sleep(0.01)
        return str(self.sock.pipes[0].local_address)

    def close(self) -> None:
        self.sock.close()


def _raw(hub, wire: str):
    if wire == "nng":
        return _RawNng(hub.address)
    return _RawStream(hub.stream_address, local=wire == "stream-local")


WIRES = ["nng", "stream-tcp", "stream-local"]


@pytest.mark.parametrize("wire", WIRES)
def test_wrong_proof_on_the_wire_is_a_warning_naming_the_peer(hub, wire, caplog):
    caplog.set_level(logging.DEBUG, logger="fiber")
    raw = _raw(hub, wire)
    try:
        reply = raw.exchange(AUTH1 + auth.new_nonce())
        assert reply[:1] == OK
        # named while connected: once the hub refuses and closes it, nng dials again at
        # once, and the new connection has another port
        peer = raw.name()
        proof = auth.answer(OTHER, CLIENT_ROLE, reply[1:1 + NONCE_SIZE])
        assert raw.exchange(AUTH3 + proof) == AUTH_REFUSED
    finally:
        raw.close()
    (message,) = _records(caplog, logging.WARNING, "wrong proof")
    assert peer in message


@pytest.mark.parametrize("wire", WIRES)
def test_a_drop_mid_handshake_is_only_debug(hub, wire, caplog):
    caplog.set_level(logging.DEBUG, logger="fiber")
    raw = _raw(hub, wire)
    peer = raw.name()
    assert raw.exchange(AUTH1 + auth.new_nonce())[:1] == OK
    raw.close()  # like a worker that exits while it connects
    (message,) = _records(caplog, logging.DEBUG, "dropped during the handshake")
    assert peer in message
    time.sleep(0.2)
    assert _warnings(caplog) == []


@pytest.mark.parametrize("client", [Client, StreamClient])
def test_a_client_with_another_secret_raises_and_the_hub_goes_on(hub, client, caplog):
    caplog.set_level(logging.DEBUG, logger="fiber")
    address = hub.address if client is Client else hub.stream_address
    with pytest.raises((AuthenticationError, ConnectionLostError)):
        client(address, authkey=OTHER)
    _records(caplog, logging.DEBUG, "dropped during the handshake")
    assert _warnings(caplog) == []  # it stopped before proving anything: not an attack
    good = client(address)
    good.close()


@pytest.mark.parametrize("wire", WIRES)
def test_a_silent_connection_is_closed_when_its_time_is_up(hub, wire, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="fiber")
    monkeypatch.setattr(hub_module, "AUTH_TIMEOUT", 0.3)
    monkeypatch.setattr(stream_server, "AUTH_TIMEOUT", 0.3)
    raw = _raw(hub, wire)
    try:
        peer = raw.name()
        (message,) = _records(caplog, logging.WARNING, "did not complete the handshake")
        assert peer in message and "0.3s" in message
    finally:
        raw.close()
