"""The direct stream wire (fiber.wire.stream) against a real hub on loopback: the same
semantics as the nng wire (authentication first, parked replies, independent lines,
peer loss), plus what only a stream must take care of (a big reply to a reader that is
busy must not block the replying thread)."""

from __future__ import annotations

import pickle
import socket
import struct
import threading
import time

import pytest

import fiber
from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import transport
from fiber.wire.stream import framing
from fiber.wire.stream.client import StreamClient


class _Channel:
    """Echoes, parks requests that start with b"park", answers them on b"release"."""

    def __init__(self) -> None:
        self.parked: list = []
        self.gone: list[int] = []
        self.peers: set[int] = set()
        self.lock = threading.Lock()

    def handle(self, request, payload) -> None:
        data = bytes(payload)
        with self.lock:
            self.peers.add(request.peer)
            if data.startswith(b"park"):
                self.parked.append((request, data))
                return
            if data == b"release":
                parked, self.parked = self.parked, []
                for r, d in reversed(parked):  # answer in the reverse order
                    r.reply(b"answer:" + d)
        request.reply(data)

    def peer_gone(self, peer: int) -> None:
        self.gone.append(peer)


@pytest.fixture()
def hub():
    h = transport.Hub("127.0.0.1")
    yield h
    h.close()


def _wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_request_reply_and_lines_answered_out_of_order(hub):
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        assert client.request(cid, b"hello") == b"hello"
        lines = [client.context() for _ in range(3)]
        got: dict[int, bytes] = {}

        def wait(i, ctx):
            got[i] = ctx.recv(timeout=10)

        threads = []
        for i, ctx in enumerate(lines):
            ctx.send(cid, b"park%d" % i)
            t = threading.Thread(target=wait, args=(i, ctx))
            t.start()
            threads.append(t)
        _wait_for(lambda: len(ch.parked) == 3)
        assert client.request(cid, b"release") == b"release"
        for t in threads:
            t.join(10)
        assert got == {i: b"answer:park%d" % i for i in range(3)}
    finally:
        client.close()


def _unread(sock: socket.socket) -> int:
    """Bytes in the kernel's receive queue of ``sock`` (FIONREAD)."""
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_drain_takes_what_arrived_off_the_kernels_queue(hub):
    """Replies that arrive while no thread reads stay in the kernel until drain()
    takes them (a pool worker drains as it sends results, so a kill closes its
    connection in order instead of resetting it, issue #17); each line still gets its
    own replies, a frame cut in two included."""
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        big = client.context()
        small = client.context()
        big.send(cid, b"x" * 300_000)  # echoed: more than one read's worth
        small.send(cid, b"small")
        # private read: the bytes waiting in the kernel under the client's socket
        _wait_for(lambda: _unread(client._sock) > 0)
        time.sleep(0.2)  # the rest arrives
        assert _unread(client._sock) > 0  # nobody reads: it waits in the kernel
        client.drain()
        while _unread(client._sock):  # a big frame may come in pieces
            client.drain()
        assert _unread(client._sock) == 0
        assert small.recv(timeout=0) == b"small"
        assert big.recv(timeout=10) == b"x" * 300_000
        client.drain()  # nothing there: returns at once
        assert client.request(cid, b"after") == b"after"
    finally:
        client.close()


def test_big_reply_does_not_block_the_replying_thread(hub):
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    client = StreamClient(hub.stream_address)
    try:
        ctx = client.context()
        ctx.send(cid, b"park")
        _wait_for(lambda: len(ch.parked) == 1)
        request, _ = ch.parked.pop()
        big = bytes(range(256)) * (200 * 1024)  # 50 MiB, far above socket buffers
        t0 = time.monotonic()
        assert request.reply(big)
        assert time.monotonic() - t0 < 2.0  # queued, not written while nobody reads
        assert not request.reply(b"twice")  # one reply per request
        time.sleep(0.2)
        assert ctx.recv(timeout=30) == big
        # and big requests the other way
        assert client.request(cid, big[:30_000_000]) == big[:30_000_000]
    finally:
        client.close()


def test_peer_gone_when_the_client_closes(hub):
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    client = StreamClient(hub.stream_address)
    client.request(cid, b"x")
    (peer,) = ch.peers
    client.close()
    _wait_for(lambda: peer in ch.gone)
    with pytest.raises(ConnectionLostError):
        client.request(cid, b"x")


def test_timeout_and_channels_not_on_the_stream(hub):
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    nng_only = hub.add_channel(_Channel())
    client = StreamClient(hub.stream_address)
    try:
        ctx = client.context()
        t0 = time.monotonic()
        with pytest.raises(ConnectionLostError, match="no answer"):
            ctx.request(cid, b"park-forever", timeout=0.3)
        assert time.monotonic() - t0 < 5
        with pytest.raises(ConnectionLostError, match="no longer exists"):
            client.request(nng_only, b"x")
        assert client.request(cid, b"still fine") == b"still fine"
    finally:
        client.close()


class _Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_rogue_stream_clients_are_rejected(hub, tmp_path):
    marker = tmp_path / "pwned"
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    host, port, _ = framing.split_address(hub.stream_address)
    # a raw pickle without the handshake
    body = b"M" + struct.pack("<Q", cid) + pickle.dumps(_Exploit(str(marker)))
    with socket.create_connection((host, port), timeout=10) as rogue:
        rogue.sendall(struct.pack("<QI", len(body), 1) + body)
        rogue.settimeout(10)
        data = b""
        try:
            while chunk := rogue.recv(4096):
                data += chunk
        except OSError:
            pass
    assert transport.ERROR in data[12:13] or data == b""
    # a huge length before authenticating is refused, not allocated
    with socket.create_connection((host, port), timeout=10) as rogue:
        rogue.sendall(struct.pack("<QI", 1 << 40, 0))
        rogue.settimeout(10)
        try:
            while rogue.recv(4096):
                pass
        except OSError:
            pass
    # the wrong secret
    with pytest.raises((AuthenticationError, ConnectionLostError)):
        StreamClient(hub.stream_address, authkey=b"not the run's secret")
    assert not marker.exists()
    assert ch.peers == set()
    client = StreamClient(hub.stream_address)
    assert client.request(cid, b"ok") == b"ok"
    client.close()


def test_local_socket_on_this_host_and_tcp_without_it(hub):
    ch = _Channel()
    cid = hub.add_channel(ch, stream=True)
    address = hub.stream_address
    assert "?local=" in address  # Linux: an abstract Unix socket beside TCP
    local = StreamClient(address)
    tcp = StreamClient(address.partition("?")[0])
    gone_name = address.partition("?local=")[0] + "?local=fiber-stream-nobody-here"
    fallback = StreamClient(gone_name)  # no such local socket: TCP
    try:
        # private read: which socket family each connection chose (not shown by any API)
        assert local._sock.family == socket.AF_UNIX
        assert tcp._sock.family == socket.AF_INET
        assert fallback._sock.family == socket.AF_INET
        for client in (local, tcp, fallback):
            assert client.request(cid, b"ping") == b"ping"
    finally:
        for client in (local, tcp, fallback):
            client.close()


def test_unreachable_stream_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionLostError, match="cannot connect"):
        StreamClient(f"stream://127.0.0.1:{port}")


def _square(x):
    return x * x


def test_pool_workers_use_the_stream_wire():
    with fiber.Pool(2) as pool:
        # private read: the address the pool's channel gave its workers
        assert pool._address.startswith("stream://")
        assert pool.map(_square, range(100)) == [x * x for x in range(100)]
