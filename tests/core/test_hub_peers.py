"""A dropped connection is reported only to the channels it sent requests to (issue
#29: ``Hub.peer_lost`` called every channel of the hub for each dropped connection,
O(N) per ended job and O(N^2) for the end of a pool of N workers).

A real hub on loopback, real stream and nng clients; the channels are small recorders
written here (they stand for a queue's or a pool's channel: the hub is what is tested).
"""

from __future__ import annotations

import threading
import time

from fiber.wire import transport
from fiber.wire.stream.client import StreamClient


class _Recorder:
    """Echoes each request; records the peers it saw and those reported gone."""

    def __init__(self) -> None:
        self.peers: set[int] = set()
        self.gone: list[int] = []
        self.lock = threading.Lock()

    def handle(self, request, payload) -> None:
        with self.lock:
            self.peers.add(request.peer)
        request.reply(bytes(payload))

    def peer_gone(self, peer: int) -> None:
        with self.lock:
            self.gone.append(peer)


def _until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _check_only_owners_told(hub, connect, stream):
    n = 40
    own = [_Recorder() for _ in range(n)]
    shared = _Recorder()
    own_ids = [hub.add_channel(ch, stream=stream) for ch in own]
    shared_id = hub.add_channel(shared, stream=stream)
    clients = []
    try:
        for i, cid in enumerate(own_ids):
            client = connect()
            clients.append(client)
            assert client.request(cid, b"own %d" % i) == b"own %d" % i
            assert client.request(shared_id, b"shared") == b"shared"
        (peer,) = own[0].peers
        clients[0].close()
        _until(lambda: peer in own[0].gone and peer in shared.gone)
        time.sleep(0.3)  # (a report to another channel would have come by now)
        told = [i for i, ch in enumerate(own) if ch.gone]
        assert told == [0], f"channels {told} were told of one connection's loss"
        assert own[0].gone == [peer] and shared.gone == [peer]
        # a removed channel is not told, and the hub forgets it for that peer
        hub.remove_channel(own_ids[1])
        (peer1,) = own[1].peers
        clients[1].close()
        _until(lambda: peer1 in shared.gone)
        time.sleep(0.3)
        assert own[1].gone == []
        assert [i for i, ch in enumerate(own) if ch.gone] == [0]
    finally:
        for client in clients[2:]:
            client.close()


def test_a_dropped_stream_connection_is_told_only_to_its_channels():
    """40 stream connections, each sending to a channel of its own and to a shared
    one: closing one reports its loss to its own channel and the shared one only
    (all 41 channels were told before)."""
    hub = transport.Hub("127.0.0.1")
    try:
        _check_only_owners_told(hub, lambda: StreamClient(hub.stream_address), True)
    finally:
        hub.close()


def test_a_dropped_nng_connection_is_told_only_to_its_channels():
    """As above, on the nng wire."""
    hub = transport.Hub("127.0.0.1")
    try:
        _check_only_owners_told(hub, lambda: transport.Client(hub.address), False)
    finally:
        hub.close()


def test_the_hub_keeps_nothing_for_connections_gone():
    """After every connection has gone, the hub keeps no record of which channels they
    addressed (a record per connection, dropped with it)."""
    hub = transport.Hub("127.0.0.1")
    try:
        ch = _Recorder()
        cid = hub.add_channel(ch, stream=True)
        clients = [StreamClient(hub.stream_address) for _ in range(10)]
        for client in clients:
            client.request(cid, b"x")
        for client in clients:
            client.close()
        _until(lambda: len(ch.gone) == 10)
        assert hub._peer_channels == {} and hub._channel_peers == {}
    finally:
        hub.close()
