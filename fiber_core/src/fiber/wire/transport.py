"""Authenticated request/reply messaging over pynng: the wire under every fiber object.

A :class:`Hub` is one listening pynng ``Rep0`` socket per process (created on first
need) that serves many *channels*: a queue, a pipe, a pool, a child's control line are
each a channel, identified by a number. A :class:`Client` is a ``Req0`` socket dialled
to one hub. Every exchange is a request answered by exactly one reply, so nothing is
lost to a slow reader (nng routes each reply to its requester and applies
backpressure); a request that must wait (``Queue.get`` on an empty queue) is *parked*
by its channel and answered later. Waits with a timeout are timed out by the hub
itself, so a reply and a timeout can never both happen.

Wire format of a request: ``b"M" + channel (8 bytes) + payload``; authentication
requests start with ``b"A"``. A reply starts with a status byte (``OK``, ``ERROR`` with
a pickled exception, ``GONE`` when the channel no longer exists).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import Protocol

import pynng

from fiber import util
from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import auth
from fiber.wire.framing import check_reply, request_frame
from fiber.wire.protocol import (
    AUTH1,
    AUTH3,
    AUTH_TIMEOUT,
    CONNECT_TIMEOUT,
    ERROR,
    GONE,
    MSG,
    OK,
)
from fiber.wire.protocol import CHANNEL as _CHANNEL

logger = logging.getLogger("fiber")

# pynng finalizes nng at exit, while fiber's daemon threads may still sit in nng
# calls (a blocked recv): nng then aborts the process. The OS reclaims everything at
# exit anyway, so fiber keeps nng alive until the process ends.
try:
    import atexit

    atexit.unregister(pynng.nng._pynng_atexit)
except AttributeError:  # another pynng version: nothing to undo
    pass


class _Context(pynng.Context):
    """A pynng context that can be garbage collected after its socket is closed
    (pynng's own raises from ``__del__`` then)."""

    def __del__(self) -> None:
        try:
            self.close()
        except pynng.NNGException:
            pass

    def set_recv_timeout(self, seconds: float | None) -> None:
        ms = -1 if seconds is None else max(1, int(seconds * 1000))
        pynng.check_err(pynng.lib.nng_ctx_set_ms(self.context, b"recv-timeout", ms))



class Request:
    """A request received by a hub, to be answered once with :meth:`reply`."""

    __slots__ = ("_ctx", "peer", "answered", "__weakref__")

    def __init__(self, ctx: pynng.Context, peer: int) -> None:
        self._ctx = ctx
        self.peer = peer
        self.answered = False

    def reply(self, data: bytes, status: bytes = OK) -> bool:
        """Send the reply; False when the requester is gone or it was answered."""
        if self.answered:
            return False
        self.answered = True
        ctx, self._ctx = self._ctx, None
        try:
            ctx.send(status + data if data else status)
            return True
        except pynng.NNGException:
            return False
        finally:
            try:
                ctx.close()
            except pynng.NNGException:
                pass


class Channel(Protocol):
    def handle(self, request: Request, payload: memoryview) -> None:
        """Answer (now or later) a request; called on the hub's thread."""

    def peer_gone(self, peer: int) -> None:
        """A connected process went away: drop what it waited for."""


class _Timers:
    """A thread that runs callbacks at deadlines (hub-side timeouts, heartbeats)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def call_at(self, deadline: float, fn: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._counter), fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fiber-timers",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._heap or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                if self._closed:
                    return
                _, _, fn = heapq.heappop(self._heap)
            try:
                fn()
            except Exception:  # noqa: BLE001 - a timer must not kill the thread
                logger.exception("fiber timer callback failed")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


class Hub:
    """The listening side: serves channels to authenticated clients."""

    def __init__(self, host: str, authkey: bytes | None = None) -> None:
        self.authkey = authkey or auth.get_authkey()
        self._channels: dict[int, Channel] = {}
        self._stream_channels: set[int] = set()
        self._stream = None  # fiber.stream.StreamListener, started on first use
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._peers: dict[int, bytes | bool] = {}  # pipe id -> nonce sent, or True
        self._pipes: dict[int, pynng.Pipe] = {}
        # authenticated connections that went away (their last messages may still come)
        self._departed: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.timers = _Timers()
        self._sock = pynng.Rep0(recv_max_size=0)
        self._contexts: weakref.WeakSet = weakref.WeakSet()
        self._sock.add_post_pipe_connect_cb(self._on_connect)
        self._sock.add_post_pipe_remove_cb(self._on_remove)
        bracketed = f"[{host}]" if ":" in host else host
        listener = self._sock.listen(f"tcp://{bracketed}:0")
        port = str(listener.local_address).rsplit(":", 1)[1]
        self.host = host
        self.address = f"tcp://{bracketed}:{port}"
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="fiber-hub", daemon=True)
        self._thread.start()
        logger.debug("hub listening on %s", self.address)

    # -- channels -------------------------------------------------------------------
    def add_channel(self, channel: Channel, channel_id: int | None = None,
                    stream: bool = False) -> int:
        """Serve ``channel``; ``stream=True`` also serves it on the direct stream wire."""
        with self._lock:
            cid = next(self._ids) if channel_id is None else channel_id
            self._channels[cid] = channel
            if stream:
                self._stream_channels.add(cid)
            return cid

    def channel(self, channel_id: int) -> Channel | None:
        return self._channels.get(channel_id)

    def remove_channel(self, channel_id: int) -> None:
        with self._lock:
            self._channels.pop(channel_id, None)
            self._stream_channels.discard(channel_id)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        self.timers.call_at(time.monotonic() + delay, fn)

    # -- connections ----------------------------------------------------------------
    def _on_connect(self, pipe: pynng.Pipe) -> None:
        with self._lock:
            self._peers.setdefault(pipe.id, False)
            self._pipes[pipe.id] = pipe
        self.timers.call_at(time.monotonic() + AUTH_TIMEOUT, lambda: self._expire(pipe.id))

    def _expire(self, pipe_id: int) -> None:
        with self._lock:
            state = self._peers.get(pipe_id)
            pipe = self._pipes.get(pipe_id)
        if state is not True and pipe is not None:
            logger.warning("closing a connection that did not authenticate in time")
            self._close_pipe(pipe)

    def _on_remove(self, pipe: pynng.Pipe) -> None:
        with self._lock:
            was = self._peers.pop(pipe.id, None)
            self._pipes.pop(pipe.id, None)
            if was is True:
                self._departed[pipe.id] = None
                while len(self._departed) > 1024:
                    self._departed.popitem(last=False)
        if was is True:
            self.peer_lost(pipe.id)

    @staticmethod
    def _close_pipe(pipe: pynng.Pipe) -> None:
        # closing from an nng callback thread can deadlock; do it on a thread of ours
        threading.Thread(target=lambda: _quiet(pipe.close), daemon=True).start()

    def _authenticate(self, request: Request, pipe: pynng.Pipe, data: bytes) -> None:
        if pipe.id in self._departed:
            return  # sent just before its authenticated connection went away
        # the first message may arrive before the connect callback has run: None
        state = self._peers.get(pipe.id, False)
        if data[:2] == AUTH1 and state is False and len(data) == 2 + auth.NONCE_SIZE:
            nonce = auth.new_nonce()
            with self._lock:
                self._peers[pipe.id] = nonce
                self._pipes[pipe.id] = pipe
            request.reply(nonce + auth.answer(self.authkey, b"hub", data[2:]))
            return
        if data[:2] == AUTH3 and isinstance(state, bytes) and \
                auth.verify(self.authkey, b"client", state, data[2:]):
            with self._lock:
                self._peers[pipe.id] = True
            request.reply(b"")
            return
        logger.warning("rejected a connection that did not prove the run's secret")
        request.reply(b"authentication failed", ERROR)
        self._close_pipe(pipe)

    def _serve(self) -> None:
        sock = self._sock
        while True:
            try:
                ctx = _Context(sock)
                self._contexts.add(ctx)
                msg = ctx.recv_msg()
            except pynng.Closed:
                return
            except pynng.NNGException:
                if self._closed:
                    return
                logger.exception("hub receive failed")
                continue
            pipe = msg.pipe
            data = msg.bytes
            request = Request(ctx, pipe.id)
            if self._peers.get(pipe.id) is not True:
                self._authenticate(request, pipe, data)
                continue
            self.dispatch(request, data)

    def dispatch(self, request, data: bytes, stream: bool = False) -> None:
        """Hand an authenticated request to its channel (on the thread of its wire)."""
        if data[:1] != MSG or len(data) < 9:
            request.reply(b"malformed request", ERROR)
            return
        cid = _CHANNEL.unpack_from(data, 1)[0]
        channel = self._channels.get(cid)
        if channel is None or (stream and cid not in self._stream_channels):
            request.reply(b"", GONE)
            return
        try:
            channel.handle(request, memoryview(data)[9:])
        except Exception:  # noqa: BLE001 - a bad request must not stop the hub
            logger.exception("channel %d failed to handle a request", cid)
            if not request.answered:
                request.reply(b"internal error", ERROR)

    @property
    def stream_address(self) -> str:
        """The address of this hub's direct stream wire (see :mod:`fiber.stream`),
        which serves the channels added with ``stream=True``; started on first use."""
        with self._lock:
            if self._stream is None:
                from fiber.wire.stream import StreamListener

                self._stream = StreamListener(self, self.host)
            return self._stream.address

    def peer_lost(self, peer: int) -> None:
        """A connection of either wire is gone: its channels drop what it waited for."""
        with self._lock:
            channels = list(self._channels.values())
        for channel in channels:
            try:
                channel.peer_gone(peer)
            except Exception:  # noqa: BLE001
                logger.exception("peer_gone handler failed")

    def close(self) -> None:
        self._closed = True
        self.timers.close()
        if self._stream is not None:
            self._stream.close()
        _close_all(self._contexts, self._sock)


def _close_all(contexts: weakref.WeakSet, sock: pynng.Socket) -> None:
    """Close contexts before their socket (pynng complains the other way round)."""
    for ctx in list(contexts):
        _quiet(ctx.close)
    _quiet(sock.close)


def _quiet(fn: Callable[[], object]) -> None:
    try:
        fn()
    except pynng.NNGException:
        pass


class Client:
    """A connection to one hub. :meth:`request` is thread-safe (one request at a
    time); :meth:`context` gives independent request lines for concurrent use."""

    def __init__(self, address: str, authkey: bytes | None = None,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.address = address
        self._key = authkey or auth.get_authkey()
        self._lock = threading.Lock()
        self.lost = False
        self._on_lost = on_lost
        self._sock = pynng.Req0(recv_max_size=0, resend_time=-1)
        self._contexts: weakref.WeakSet = weakref.WeakSet()
        self._sock.add_post_pipe_remove_cb(self._removed)
        try:
            self._sock.dial(address, block=True)
        except pynng.NNGException as exc:
            _quiet(self._sock.close)
            raise ConnectionLostError(
                f"cannot connect to the fiber process at {address}: {exc} "
                "(it has exited, or this host cannot reach that address; see the "
                "listen_address setting)"
            ) from None
        self._handshake()

    def _handshake(self) -> None:
        self._sock.recv_timeout = int(CONNECT_TIMEOUT * 1000)
        try:
            nonce = auth.new_nonce()
            self._sock.send(AUTH1 + nonce)
            reply = self._sock.recv()
            if reply[:1] != OK or not auth.verify(
                    self._key, b"hub", nonce, reply[1 + auth.NONCE_SIZE:]):
                raise AuthenticationError(
                    f"the process at {self.address} does not hold this run's secret")
            hub_nonce = reply[1:1 + auth.NONCE_SIZE]
            self._sock.send(AUTH3 + auth.answer(self._key, b"client", hub_nonce))
            if self._sock.recv()[:1] != OK:
                raise AuthenticationError(
                    f"the process at {self.address} rejected this run's secret")
        except pynng.NNGException as exc:
            self.close()
            raise ConnectionLostError(f"handshake with {self.address} failed: {exc}") from None
        except AuthenticationError:
            self.close()
            raise
        finally:
            if not self.lost:
                self._sock.recv_timeout = -1

    def _removed(self, pipe: pynng.Pipe) -> None:
        self.lost = True
        threading.Thread(target=self.close, daemon=True).start()
        if self._on_lost is not None:
            self._on_lost()

    frame = staticmethod(request_frame)

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        """Send a request and return the reply's payload (status checked)."""
        with self._lock:
            return self._exchange(self._sock, self.frame(channel, payload), timeout)

    def context(self) -> ClientContext:
        return ClientContext(self)

    def _exchange(self, line, data: bytes, timeout: float | None) -> bytes:
        if self.lost:
            raise ConnectionLostError(f"the connection to {self.address} is lost")
        try:
            line.send(data)
            if isinstance(line, _Context):
                line.set_recv_timeout(timeout)
                reply = line.recv()
            else:
                if timeout is not None:
                    line.recv_timeout = max(1, int(timeout * 1000))
                try:
                    reply = line.recv()
                finally:
                    if timeout is not None and not self.lost:
                        _quiet(lambda: setattr(line, "recv_timeout", -1))
        except pynng.Timeout:
            raise ConnectionLostError(
                f"no answer from {self.address} within {timeout:.1f}s") from None
        except pynng.NNGException as exc:
            self.lost = True
            raise ConnectionLostError(
                f"the connection to {self.address} is lost ({exc})") from None
        return check_reply(reply, self.address)

    def close(self) -> None:
        self.lost = True
        _close_all(self._contexts, self._sock)


class ClientContext:
    """An independent request line on a client (several may wait at once)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._ctx = _Context(client._sock)
        client._contexts.add(self._ctx)

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        return self._client._exchange(self._ctx, Client.frame(channel, payload), timeout)

    def send(self, channel: int, payload: bytes) -> None:
        if self._client.lost:
            raise ConnectionLostError(f"the connection to {self._client.address} is lost")
        try:
            self._ctx.send(Client.frame(channel, payload))
        except pynng.NNGException as exc:
            raise ConnectionLostError(str(exc)) from None

    def recv(self) -> bytes:
        try:
            reply = self._ctx.recv()
        except pynng.NNGException as exc:
            raise ConnectionLostError(
                f"the connection to {self._client.address} is lost ({exc})") from None
        return check_reply(reply, self._client.address)

    def close(self) -> None:
        _quiet(self._ctx.close)


# -- process-wide hubs and clients ---------------------------------------------------
_hubs: dict[str, Hub] = {}
_clients: dict[str, Client] = {}
_registry_lock = threading.Lock()


def get_hub(host: str) -> Hub:
    """This process's hub for ``host`` (the listen address), created on first use."""
    with _registry_lock:
        hub = _hubs.get(host)
        if hub is None:
            hub = _hubs[host] = Hub(host)
            util.at_exit("connections", util.CONNECTIONS, shutdown)
        return hub


def get_client(address: str) -> Client:
    """A shared client connection to ``address`` (created on first use): an nng
    :class:`Client`, or a :class:`fiber.stream.StreamClient` for a stream address."""
    with _registry_lock:
        client = _clients.get(address)
        if client is not None and not client.lost:
            return client
    if address.startswith("stream://"):
        from fiber.wire.stream import StreamClient

        client = StreamClient(address)
    else:
        client = Client(address)
    with _registry_lock:
        _clients[address] = client
    util.at_exit("connections", util.CONNECTIONS, shutdown)
    return client


def register_client(client: Client) -> None:
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

