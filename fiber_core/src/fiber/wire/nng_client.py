"""The connecting side of the nng wire: a :class:`Client` is a pynng ``Req0`` socket
dialled to one hub (:mod:`fiber.wire.hub`), authenticated by the handshake of
:mod:`fiber.wire.handshake`; :class:`ClientContext` is an independent request line on
it, for threads that wait at the same time. A request longer than
:data:`~fiber.wire.protocol.NNG_MESSAGE_MAX` goes in pieces (a hub reads no longer
message from anyone: :mod:`fiber.wire.hub`)."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable

import pynng

from fiber import threads
from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import auth
from fiber.wire.framing import check_reply, request_frame
from fiber.wire.handshake import prove
from fiber.wire.nng import Context, close_all, quiet
from fiber.wire.protocol import CONNECT_TIMEOUT, NNG_MESSAGE_MAX, NNG_RECV_MAX, PART, PART_HEADER

__all__ = ["Client", "ClientContext"]


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
        self._numbers = itertools.count(1)  # of the long requests sent in pieces
        self._contexts: weakref.WeakSet[Context] = weakref.WeakSet()
        self._sock.add_post_pipe_remove_cb(self._removed)
        try:
            self._sock.dial(address, block=True)
        except pynng.NNGException as exc:
            quiet(self._sock.close)
            raise ConnectionLostError(
                f"cannot connect to the fiber process at {address}: {exc} "
                "(it has exited, or this host cannot reach that address; see the "
                "listen_address setting)"
            ) from None
        self._handshake()

    def _handshake(self) -> None:
        sock = self._sock

        def exchange(message: bytes) -> bytes:
            sock.send(message)
            return sock.recv()

        sock.recv_timeout = int(CONNECT_TIMEOUT * 1000)
        try:
            prove(self._key, exchange, self.address)
        except pynng.NNGException as exc:
            self.close()
            raise ConnectionLostError(f"handshake with {self.address} failed: {exc}") from None
        except AuthenticationError:
            self.close()
            raise
        finally:
            if not self.lost:
                sock.recv_timeout = -1

    def _removed(self, pipe: pynng.Pipe) -> None:
        self.lost = True
        threads.start("fiber-nng-close", self.close,
                      exempt="closes a connection already lost (on_lost below tells its users)")
        if self._on_lost is not None:
            self._on_lost()

    frame = staticmethod(request_frame)

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        """Send a request and return the reply's payload (status checked)."""
        with self._lock:
            return self._exchange(self._sock, self.frame(channel, payload), timeout)

    def context(self) -> ClientContext:
        """A new independent request line."""
        return ClientContext(self)

    def _exchange(self, line: pynng.Req0 | Context, data: bytes,
                  timeout: float | None) -> bytes:
        if self.lost:
            raise ConnectionLostError(f"the connection to {self.address} is lost")
        try:
            data = self._send_pieces(line, data)
            line.send(data)
            if isinstance(line, Context):
                line.set_recv_timeout(timeout)
                reply = line.recv()
            else:
                if timeout is not None:
                    line.recv_timeout = max(1, int(timeout * 1000))
                try:
                    reply = line.recv()
                finally:
                    if timeout is not None and not self.lost:
                        quiet(lambda: setattr(line, "recv_timeout", -1))
        except pynng.Timeout:
            raise ConnectionLostError(
                f"no answer from {self.address} within {timeout or 0:.1f}s") from None
        except pynng.NNGException as exc:
            self.lost = True
            raise ConnectionLostError(
                f"the connection to {self.address} is lost ({exc})") from None
        return check_reply(reply, self.address)

    def _send_pieces(self, line: pynng.Req0 | Context, data: bytes) -> bytes:
        """Send all but the last piece of a request too long for one message (each
        acknowledged before the next); the last piece, to send as the request (the
        whole request when it is short)."""
        if len(data) <= NNG_RECV_MAX:
            return data
        number = next(self._numbers)
        view = memoryview(data)
        while len(view) > NNG_MESSAGE_MAX:
            line.send(PART + PART_HEADER.pack(number, 0) + view[:NNG_MESSAGE_MAX])
            check_reply(line.recv(), self.address)
            view = view[NNG_MESSAGE_MAX:]
        return PART + PART_HEADER.pack(number, 1) + view

    def close(self) -> None:
        self.lost = True
        close_all(self._contexts, self._sock)


class ClientContext:
    """An independent request line on a client (several may wait at once)."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._ctx = Context(client._sock)
        client._contexts.add(self._ctx)

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        """Send a request on this line and return the reply's payload."""
        return self._client._exchange(self._ctx, Client.frame(channel, payload), timeout)

    def send(self, channel: int, payload: bytes) -> None:
        """Send a request on this line; :meth:`recv` gets its reply."""
        if self._client.lost:
            raise ConnectionLostError(f"the connection to {self._client.address} is lost")
        try:
            self._ctx.send(self._client._send_pieces(self._ctx, Client.frame(channel, payload)))
        except pynng.NNGException as exc:
            raise ConnectionLostError(str(exc)) from None

    def recv(self) -> bytes:
        """The payload of the reply to this line's request."""
        try:
            reply = self._ctx.recv()
        except pynng.NNGException as exc:
            raise ConnectionLostError(
                f"the connection to {self._client.address} is lost ({exc})") from None
        return check_reply(reply, self._client.address)

    def close(self) -> None:
        quiet(self._ctx.close)
