"""The wire as the runtime uses it: the process-wide hubs and client connections.

A process has one hub per listen host (:func:`get_hub`, :mod:`fiber.wire.hub`) and
shares one client connection per address (:func:`get_client`): a pynng
:class:`~fiber.wire.nng_client.Client` for a hub's ``tcp://`` address, a
:class:`~fiber.wire.stream.client.StreamClient` for a ``stream://`` one. Everything
is closed once at exit (:func:`shutdown`, in fiber's ordered exit path). The wire
format of every message, handshake included, is described in
:mod:`fiber.wire.protocol`.

The classes the runtime annotates with are re-exported here (``transport.Hub``,
``transport.Request``, ``transport.Client``, ...), so that a runtime module needs this
one import of the wire's connections.
"""

from __future__ import annotations

import logging
import threading

from fiber import util
from fiber.wire import shm
from fiber.wire.channel import Channel, Request
from fiber.wire.hub import Hub
from fiber.wire.nng_client import Client, ClientContext
from fiber.wire.protocol import ERROR, STREAM_SCHEME
from fiber.wire.stream.client import StreamClient

__all__ = [
    "ERROR", "Channel", "Client", "ClientContext", "Hub", "Request", "get_client",
    "get_hub", "local_hub", "register_client", "shutdown",
]

_hubs: dict[str, Hub] = {}
_clients: dict[str, Client | StreamClient] = {}
_registry_lock = threading.Lock()
logger = logging.getLogger("fiber")


def get_hub(host: str) -> Hub:
    """This process's hub for ``host`` (the listen address), created on first use.
    A process's first hub also sweeps the shared-memory segments that ended processes
    of this machine left behind (:func:`fiber.wire.shm.sweep`): every fiber program
    that talks to other processes cleans up after those that were killed."""
    with _registry_lock:
        hub = _hubs.get(host)
        if hub is not None:
            return hub
        first = not _hubs
        hub = _hubs[host] = Hub(host)
        util.at_exit("connections", util.CONNECTIONS, shutdown)
    if first:
        try:
            shm.sweep()
        except Exception:  # noqa: BLE001 - cleaning up after others is best effort
            logger.debug("sweeping shared-memory segments failed", exc_info=True)
    return hub


def get_client(address: str) -> Client | StreamClient:
    """A shared client connection to ``address`` (created on first use): an nng
    :class:`Client`, or a :class:`~fiber.wire.stream.client.StreamClient` for a
    ``stream://`` address."""
    with _registry_lock:
        client = _clients.get(address)
        if client is not None and not client.lost:
            return client
    if address.startswith(STREAM_SCHEME):
        client = StreamClient(address)
    else:
        client = Client(address)
    with _registry_lock:
        _clients[address] = client
    util.at_exit("connections", util.CONNECTIONS, shutdown)
    return client


def register_client(client: Client | StreamClient) -> None:
    """Make ``client`` the shared connection to its address."""
    with _registry_lock:
        _clients[client.address] = client


def shutdown() -> None:
    """Close every client and hub of this process (at exit)."""
    with _registry_lock:
        clients, hubs = list(_clients.values()), list(_hubs.values())
        _clients.clear()
        _hubs.clear()
    for client in clients:
        client.close()
    for hub in hubs:
        hub.close()


def local_hub(address: str) -> Hub | None:
    """The hub of this process that listens on ``address``, if any."""
    with _registry_lock:
        for hub in _hubs.values():
            if hub.address == address:
                return hub
    return None
