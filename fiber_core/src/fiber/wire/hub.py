"""A process's hub: the listening side of the wire, one per process and listen host.

A :class:`Hub` serves many *channels* (:mod:`fiber.wire.channel`), each identified by
a number, to authenticated clients. It listens on a pynng ``Rep0`` socket: every
request is answered by exactly one reply, so nothing is lost to a slow reader (nng
routes each reply to its requester and applies backpressure), and a request that must
wait (``Queue.get`` on an empty queue) is *parked* by its channel and answered later.
Waits with a timeout are timed out by the hub itself (:attr:`Hub.timers`), so a reply
and a timeout can never both happen. Channels added with ``stream=True`` are also
served on the hub's direct stream wire (:mod:`fiber.wire.stream.server`), started on
first use.

The nng side is event-driven: one thread receives every message, and a connection
(an nng *pipe*) that has not authenticated yet has its messages answered by its
:class:`~fiber.wire.handshake.HubHandshake` instead of a channel. What a stranger can
cost is bounded: nng reads no message longer than
:data:`~fiber.wire.protocol.NNG_RECV_MAX` (it drops the connection on reading a longer
length, before allocating), at most :data:`~fiber.wire.protocol.NNG_MAX_PENDING`
connections authenticate at once (the oldest is closed), each within
:data:`~fiber.wire.protocol.AUTH_TIMEOUT` seconds of connecting. Authenticated clients
send longer requests in pieces (:data:`~fiber.wire.protocol.PART`), put together here.

A connection that drops is reported (``peer_gone``) only to the channels it sent a
request to: the hub keeps, for each connection, the channels it addressed (recorded at
its first request to each), so a dropped connection costs the number of its own
channels, not the hub's (issue #29: at the end of a pool of 10,000 workers, each of the
10,000 dropped connections was reported to all 10,000 control channels). A channel
learns of a peer only from its requests (``request.peer``), so it misses no loss it
could act on.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import weakref
from collections.abc import Callable

import pynng

from fiber import threads
from fiber.errors import FiberThreadError
from fiber.wire import auth
from fiber.wire.channel import Channel, Request
from fiber.wire.gate import RateLimitedLog
from fiber.wire.handshake import HubHandshake
from fiber.wire.nng import Context, close_all, quiet
from fiber.wire.protocol import (
    AUTH_TIMEOUT,
    ERROR,
    GONE,
    MSG,
    NNG_MAX_PENDING,
    NNG_RECV_MAX,
    OK,
    PART,
    PART_HEADER,
)
from fiber.wire.protocol import CHANNEL as _CHANNEL
from fiber.wire.stream.server import StreamListener
from fiber.wire.timers import Timers

__all__ = ["Hub", "NngRequest"]

logger = logging.getLogger("fiber")

_DEPARTED_KEPT = 1024  # pipes that went away, remembered to ignore their last messages
_evicted_log = RateLimitedLog()


class NngRequest:
    """A request received on the hub's nng socket (a :class:`~fiber.wire.channel.Request`)."""

    __slots__ = ("_ctx", "peer", "answered", "__weakref__")

    def __init__(self, ctx: pynng.Context, peer: int) -> None:
        self._ctx: pynng.Context | None = ctx
        self.peer = peer
        self.answered = False

    def reply(self, data: bytes, status: bytes = OK) -> bool:
        """Send the reply; False when the requester is gone or it was answered."""
        if self.answered:
            return False
        self.answered = True
        ctx, self._ctx = self._ctx, None
        assert ctx is not None
        try:
            ctx.send(status + data if data else status)
            return True
        except pynng.NNGException:
            return False
        finally:
            quiet(ctx.close)


def _peer_name(pipe: pynng.Pipe) -> str:
    try:
        return str(pipe.remote_address)
    except (pynng.NNGException, TypeError):  # gone already
        return f"nng pipe {pipe.id}"


class Hub:
    """The listening side: serves channels to authenticated clients."""

    def __init__(self, host: str, authkey: bytes | None = None) -> None:
        self.authkey = authkey or auth.get_authkey()
        self._channels: dict[int, Channel] = {}
        self._stream_channels: set[int] = set()
        # connection -> the channels it sent requests to, and channel -> its connections
        # (authenticated connections only: an entry is made when one is admitted)
        self._peer_channels: dict[int, set[int]] = {}
        self._channel_peers: dict[int, set[int]] = {}
        self._stream: StreamListener | None = None  # started on first use
        self._ids = itertools.count(1)
        # reentrant: remove_channel runs from finalizers (a queue or pool collected),
        # which the garbage collector may run on a thread that holds this lock already
        self._lock = threading.RLock()
        # pipe id -> True once authenticated, else its handshake
        self._peers: dict[int, HubHandshake | bool] = {}
        self._pipes: dict[int, pynng.Pipe] = {}
        # connections that went away (messages they sent before may still come)
        self._departed: collections.OrderedDict[int, None] = collections.OrderedDict()
        # (pipe id, request number) -> the pieces of a long request received so far
        self._parts: dict[tuple[int, int], bytearray] = {}
        self.timers = Timers()
        self._sock = pynng.Rep0(recv_max_size=NNG_RECV_MAX)
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()
        self._sock.add_post_pipe_connect_cb(self._on_connect)
        self._sock.add_post_pipe_remove_cb(self._on_remove)
        bracketed = f"[{host}]" if ":" in host else host
        listener = self._sock.listen(f"tcp://{bracketed}:0")
        port = str(listener.local_address).rsplit(":", 1)[1]
        self.host = host
        self.address = f"tcp://{bracketed}:{port}"
        self._closed = False
        #: why the nng side stopped (its thread died), or None
        self.nng_failure: FiberThreadError | None = None
        self._thread = threads.start("fiber-hub", self._serve, fails=self._serve_died)
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
            for peer in self._channel_peers.pop(channel_id, ()):
                addressed = self._peer_channels.get(peer)
                if addressed is not None:
                    addressed.discard(channel_id)

    def call_later(self, delay: float, fn: Callable[[], None],
                   failed: Callable[[FiberThreadError], None] | None = None) -> None:
        """Run ``fn()`` on the hub's timer thread in ``delay`` seconds (``failed(error)``
        instead if that thread dies first: :meth:`~fiber.wire.timers.Timers.call_at`)."""
        self.timers.call_later(delay, fn, failed)

    def dispatch(self, request: Request, data: bytes, stream: bool = False) -> None:
        """Hand an authenticated request to its channel (on the thread of its wire)."""
        if data[:1] != MSG or len(data) < 9:
            request.reply(b"malformed request", ERROR)
            return
        cid = _CHANNEL.unpack_from(data, 1)[0]
        channel = self._channels.get(cid)
        if channel is None or (stream and cid not in self._stream_channels):
            request.reply(b"", GONE)
            return
        addressed = self._peer_channels.get(request.peer)
        if addressed is not None and cid not in addressed:
            self._addressed(request.peer, cid)
        try:
            channel.handle(request, memoryview(data)[9:])
        except Exception:  # noqa: BLE001 - a bad request must not stop the hub
            logger.exception("channel %d failed to handle a request", cid)
            if not request.answered:
                request.reply(b"internal error", ERROR)

    def _addressed(self, peer: int, cid: int) -> None:
        """Record that the connection ``peer`` sent a request to channel ``cid``."""
        with self._lock:
            addressed = self._peer_channels.get(peer)
            if addressed is None or cid not in self._channels:
                return  # the connection went away, or the channel was removed
            addressed.add(cid)
            self._channel_peers.setdefault(cid, set()).add(peer)

    def peer_joined(self, peer: int) -> None:
        """A connection of either wire has authenticated: its requests are recorded
        from now on, for :meth:`peer_lost`."""
        with self._lock:
            self._peer_channels.setdefault(peer, set())

    def peer_lost(self, peer: int) -> None:
        """A connection of either wire is gone: the channels it sent requests to drop
        what it waited for (the other channels never heard of it)."""
        with self._lock:
            cids = self._peer_channels.pop(peer, ())
            channels = []
            for cid in cids:
                peers = self._channel_peers.get(cid)
                if peers is not None:
                    peers.discard(peer)
                    if not peers:
                        del self._channel_peers[cid]
                channel = self._channels.get(cid)
                if channel is not None:
                    channels.append(channel)
        for channel in channels:
            try:
                channel.peer_gone(peer)
            except Exception:  # noqa: BLE001
                logger.exception("peer_gone handler failed")

    @property
    def failure(self) -> BaseException | None:
        """Why this hub's stream listener stopped admitting connections (its gate's
        thread died), or None."""
        return self._stream.failure if self._stream is not None else None

    def check_admitting(self) -> None:
        """Raise why this hub's stream listener stopped admitting connections, if it
        did (starting it if it has not started; a listening socket whose descriptor was
        closed behind its back is replaced first:
        :meth:`~fiber.wire.stream.server.StreamListener.check`)."""
        self.stream_address  # noqa: B018 - starts the listener
        stream = self._stream
        if stream is not None:
            stream.check()

    @property
    def stream_started(self) -> bool:
        """Whether the stream listener runs (:attr:`stream_address` starts it)."""
        return self._stream is not None

    @property
    def stream_address(self) -> str:
        """The address of this hub's direct stream wire, which serves the channels
        added with ``stream=True``; started on first use."""
        with self._lock:
            if self._stream is None:
                self._stream = StreamListener(self.host, self.authkey, self.dispatch,
                                              self.peer_lost, self.peer_joined)
            return self._stream.address

    # -- nng connections ------------------------------------------------------------
    def _on_connect(self, pipe: pynng.Pipe) -> None:
        with self._lock:
            if pipe.id in self._departed:
                return
            # the first message may have come (and made the handshake) before this ran
            self._peers.setdefault(pipe.id, HubHandshake(self.authkey, _peer_name(pipe)))
            self._pipes[pipe.id] = pipe
            pending = [pid for pid, state in self._peers.items()
                       if isinstance(state, HubHandshake) and pid in self._pipes]
            oldest = (self._pipes.get(pending[0])
                      if len(pending) > NNG_MAX_PENDING else None)
        if oldest is not None:
            _evicted_log.warning("the hub at %s closed the connection that had waited "
                                 "longest in its handshake: more than %d connections were "
                                 "authenticating at once", self.address, NNG_MAX_PENDING)
            self._close_pipe(oldest)
        try:
            self.timers.call_later(AUTH_TIMEOUT, lambda: self._expire(pipe.id),
                                   lambda error: None)  # (as below)
        except FiberThreadError:
            # no deadline can be kept (the timer thread died, logged): the connection
            # is served anyway, its requests with timeouts then fail naming the thread;
            # a stranger stays bounded by the cap on connections authenticating
            pass

    def _expire(self, pipe_id: int) -> None:
        with self._lock:
            state = self._peers.get(pipe_id)
            pipe = self._pipes.get(pipe_id)
        if isinstance(state, HubHandshake) and pipe is not None and state.expired(AUTH_TIMEOUT):
            self._close_pipe(pipe)

    def _on_remove(self, pipe: pynng.Pipe) -> None:
        with self._lock:
            state = self._peers.pop(pipe.id, None)
            self._pipes.pop(pipe.id, None)
            self._departed[pipe.id] = None
            while len(self._departed) > _DEPARTED_KEPT:
                self._departed.popitem(last=False)
            for key in [key for key in self._parts if key[0] == pipe.id]:
                del self._parts[key]
        if state is True:
            self.peer_lost(pipe.id)
        elif isinstance(state, HubHandshake):
            state.dropped()

    @staticmethod
    def _close_pipe(pipe: pynng.Pipe) -> None:
        # closing from an nng callback thread can deadlock; do it on a thread of ours
        threads.start("fiber-pipe-close", quiet, pipe.close,
                      exempt="its death costs only the closing of one connection that was "
                             "refused, evicted or timed out (logged)")

    def _authenticate(self, request: NngRequest, pipe: pynng.Pipe, data: bytes) -> None:
        with self._lock:
            if pipe.id in self._departed:
                state = None  # sent just before its connection went away
            else:
                state = self._peers.get(pipe.id)
                if state is None:  # before the connect callback ran
                    state = self._peers[pipe.id] = HubHandshake(self.authkey,
                                                                _peer_name(pipe))
                    self._pipes[pipe.id] = pipe
        if not isinstance(state, HubHandshake):
            request.reply(b"", GONE)  # nobody receives it: this frees its context
            return
        reply = state.step(data)
        if state.accepted:
            with self._lock:
                if pipe.id in self._peers:
                    self._peers[pipe.id] = True
                    self._peer_channels.setdefault(pipe.id, set())
        request.reply(reply[1:], reply[:1])
        if state.refused is not None:
            self._close_pipe(pipe)

    def _serve_died(self, error: FiberThreadError) -> None:
        """Nobody receives the nng socket's messages any more: close it, so that its
        clients' requests fail at once (``ConnectionLostError``) instead of waiting
        for a reply nobody sends; the stream wire goes on."""
        self.nng_failure = error
        logger.error("the hub at %s no longer serves its nng connections: %s",
                     self.address, error)
        close_all(self._contexts, self._sock)

    def _serve(self) -> None:
        sock = self._sock
        while True:
            try:
                ctx = Context(sock)
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
            request = NngRequest(ctx, pipe.id)
            if self._peers.get(pipe.id) is not True:
                self._authenticate(request, pipe, data)
                continue
            if data[:1] == PART:
                data = self._piece(request, pipe.id, data)
                if data is None:
                    continue
            self.dispatch(request, data)

    def _piece(self, request: NngRequest, pipe_id: int, data: bytes) -> bytes | None:
        """One piece of a long request of an authenticated client: None (the piece is
        acknowledged) until the last, then the whole request."""
        if len(data) < 1 + PART_HEADER.size:
            request.reply(b"malformed request", ERROR)
            return None
        number, last = PART_HEADER.unpack_from(data, 1)
        key = (pipe_id, number)
        with self._lock:
            buf = self._parts.setdefault(key, bytearray())
            buf += memoryview(data)[1 + PART_HEADER.size:]
            if not last:
                request.reply(b"")
                return None
            del self._parts[key]
        return bytes(buf)

    def close(self) -> None:
        self._closed = True
        self.timers.close()
        if self._stream is not None:
            self._stream.close()
        close_all(self._contexts, self._sock)
