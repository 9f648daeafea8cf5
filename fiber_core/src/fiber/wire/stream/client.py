"""The connecting side of the stream wire: :class:`StreamClient`, a connection to a
hub's stream listener with the interface of :class:`fiber.wire.nng_client.Client`
(``request``, ``context``, ``lost``, ``close``), and :class:`StreamContext`, an
independent request line on it.

The socket is blocking and has no reader thread: the thread that waits for a reply
reads frames for every line and hands the others' replies to their waiters
("leader/follower"), so a reply costs no hop through another thread.
"""

from __future__ import annotations

import collections
import itertools
import select
import socket
import threading
import time
from collections.abc import Callable

from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import auth
from fiber.wire.framing import check_reply, request_frame
from fiber.wire.handshake import prove
from fiber.wire.protocol import CONNECT_TIMEOUT
from fiber.wire.stream.framing import FRAME as _FRAME
from fiber.wire.stream.framing import (
    HANDSHAKE_MAX,
    READ_SIZE,
    allocate,
    connect,
    frame,
    read_frame_blocking,
    split_address,
)

__all__ = ["StreamClient", "StreamContext"]


class StreamClient:
    """A connection to a hub's stream listener, with the interface of
    :class:`fiber.wire.nng_client.Client` (``request``, ``context``, ``lost``, ``close``)."""

    def __init__(self, address: str, authkey: bytes | None = None,
                 on_lost: Callable[[], None] | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT) -> None:
        self.address = address
        self._key = authkey or auth.get_authkey()
        self._on_lost = on_lost
        self.lost = False
        host, port, local = split_address(address)
        try:
            self._sock = connect(host, port, local, connect_timeout)
        except OSError as exc:
            raise ConnectionLostError(
                f"cannot connect to the fiber process at {address}: {exc} "
                "(it has exited, or this host cannot reach that address; see the "
                "listen_address setting)") from None
        self._send_lock = threading.Lock()
        # the reader token: held by the one thread that reads the socket (a waiter in
        # _wait, or drain); a plain lock, so that a lone reader (a pool worker's main
        # thread) pays no Condition per reply
        self._reader = threading.Lock()
        # threads that wait for another to read (they sleep on _cond; counted under it)
        self._cond = threading.Condition()
        self._waiting = 0
        self._replies: dict[int, collections.deque[bytes]] = {}
        # lines whose replies a function takes in the thread that reads them
        # (StreamContext.on_reply)
        self._hooks: dict[int, Callable[[bytes], bool]] = {}
        #: set by the owner when a thread always waits on this connection (a job's
        #: heartbeat), so that a reply nobody waits for is still read at once
        self.always_read = False
        self._rbuf = bytearray()
        self._chunk = bytearray(READ_SIZE)
        self._lines = itertools.count(1)
        self._handshake()
        self._sock.settimeout(None)
        self._default = self.context()
        self._default_lock = threading.Lock()

    def _handshake(self) -> None:
        sock = self._sock

        def exchange(message: bytes) -> bytes:
            sock.sendall(frame(0, message))
            got = read_frame_blocking(sock, HANDSHAKE_MAX)
            if got is None:
                raise ConnectionResetError("a frame too long for a handshake")
            return got[1]

        try:
            prove(self._key, exchange, self.address)
        except OSError as exc:
            self.close()
            raise ConnectionLostError(f"handshake with {self.address} failed: {exc}") from None
        except AuthenticationError:
            self.close()
            raise

    # -- lines ----------------------------------------------------------------------
    def context(self) -> StreamContext:
        line = next(self._lines)
        with self._cond:
            self._replies[line] = collections.deque()
        return StreamContext(self, line)

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        with self._default_lock:
            return self._default.request(channel, payload, timeout)

    def _forget(self, line: int) -> None:
        with self._cond:
            self._replies.pop(line, None)
            self._hooks.pop(line, None)

    def _hooked(self, line: int, body: bytes) -> bool:
        """Whether ``line``'s hook took ``body`` (in the reading thread)."""
        hook = self._hooks.get(line)
        return hook is not None and hook(body)

    def _send(self, line: int, body: bytes) -> None:
        if self.lost:
            raise ConnectionLostError(f"the connection to {self.address} is lost")
        header = _FRAME.pack(len(body), line)
        try:
            with self._send_lock:
                if len(body) < 65536:
                    self._sock.sendall(header + body)
                else:
                    self._sock.sendall(header)
                    self._sock.sendall(body)
        except OSError as exc:
            self._lose()
            raise ConnectionLostError(
                f"the connection to {self.address} is lost ({exc})") from None

    def _wait(self, line: int, timeout: float | None) -> bytes:
        """The next reply on ``line``. One waiting thread at a time reads the socket
        (it holds the reader token) and hands other lines' replies to their waiters;
        a frame for its own line it returns without queueing it. Threads that find the
        token taken sleep on the condition, and the reader wakes them only when there
        are any (:meth:`_handed`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        queue = self._replies.get(line)
        while True:
            if queue:
                try:
                    return queue.popleft()
                except IndexError:  # another thread waiting on this line took it
                    pass
            if self.lost:
                raise ConnectionLostError(f"the connection to {self.address} is lost")
            if self._reader.acquire(False):
                if queue:  # came while the token was being taken
                    self._handed()
                    continue
                try:
                    got_line, body = self._read_frame(deadline)
                except TimeoutError:
                    self._handed()
                    raise _timeout(self.address, timeout) from None
                except OSError:
                    self._handed()
                    self._lose()
                    raise ConnectionLostError(
                        f"the connection to {self.address} is lost") from None
                if got_line == line:
                    self._handed()
                    return body
                other = self._replies.get(got_line)
                if other is not None and not (self._hooks and self._hooked(got_line, body)):
                    other.append(body)
                self._handed()
                continue
            with self._cond:
                self._waiting += 1
                try:
                    while not queue and not self.lost and self._reader.locked():
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise _timeout(self.address, timeout)
                        self._cond.wait(left)
                finally:
                    self._waiting -= 1

    def _handed(self) -> None:
        """Give the reader token back, and wake the threads waiting on other lines (for
        the replies it queued, or to take the token) if there are any. A waiter counts
        itself before it checks the token, so one that checked while it was held is
        woken here."""
        self._reader.release()
        if self._waiting:
            with self._cond:
                self._cond.notify_all()

    def drain(self) -> None:
        """Take what has arrived, without waiting, into the lines' queues (unless a
        thread is reading already). A pool worker calls it as it sends results, so that
        replies waiting for it (its next batch) leave the kernel's receive queue: a
        process killed with unread data there has its connection *reset*, and the
        kernel throws away what it had sent but not yet delivered (results held back by
        a network outage); with nothing unread, the connection closes in order and
        those results still reach the master once the network is back."""
        if self.lost or not self._reader.acquire(False):
            return
        buf = self._rbuf
        try:
            while True:
                try:
                    n = self._sock.recv_into(self._chunk, 0, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                if not n:  # the end: the next waiter's read finds it too
                    break
                buf += memoryview(self._chunk)[:n]
                if n < len(self._chunk):
                    break
        except OSError:
            pass  # the next waiter's read finds it
        finally:
            while len(buf) >= _FRAME.size:
                size, line = _FRAME.unpack_from(buf)
                end = _FRAME.size + size
                if len(buf) < end:
                    break  # the rest of a frame is still on its way
                queue = self._replies.get(line)
                if queue is not None:
                    body = bytes(buf[_FRAME.size:end])
                    if not (self._hooks and self._hooked(line, body)):
                        queue.append(body)
                del buf[:end]
            self._handed()

    def _read_frame(self, deadline: float | None) -> tuple[int, bytes]:
        """The next frame (line, body); raises :class:`OSError` when the connection
        ends, or announces a frame longer than can be allocated, and
        :class:`TimeoutError` at ``deadline``."""
        buf = self._rbuf
        if deadline is not None and not buf:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                raise TimeoutError
        if not buf:
            # the usual case: one whole frame per read, taken from the read buffer
            # without passing the bytearray of what is left
            got = self._sock.recv_into(self._chunk)
            if not got:
                raise ConnectionResetError("connection closed")
            if got >= _FRAME.size:
                size, line = _FRAME.unpack_from(self._chunk)
                if got == _FRAME.size + size:
                    return line, bytes(memoryview(self._chunk)[_FRAME.size:got])
            buf += memoryview(self._chunk)[:got]
        while len(buf) < _FRAME.size:
            got = self._sock.recv_into(self._chunk)
            if not got:
                raise ConnectionResetError("connection closed")
            buf += memoryview(self._chunk)[:got]
        size, line = _FRAME.unpack_from(buf)
        end = _FRAME.size + size
        if len(buf) >= end:
            body = bytes(buf[_FRAME.size:end])
            del buf[:end]
            return line, body
        big = allocate(size)
        have = len(buf) - _FRAME.size
        big[:have] = buf[_FRAME.size:]
        buf.clear()
        view = memoryview(big)
        while have < size:
            n = self._sock.recv_into(view[have:])
            if n == 0:
                raise ConnectionResetError("connection closed")
            have += n
        return line, bytes(big)

    def _lose(self) -> None:
        with self._cond:
            was, self.lost = self.lost, True
            self._cond.notify_all()
        if not was:
            try:
                self._sock.close()
            except OSError:
                pass
            if self._on_lost is not None:
                self._on_lost()

    def close(self) -> None:
        with self._cond:
            self.lost = True
            self._cond.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


def _timeout(address: str, timeout: float | None) -> ConnectionLostError:
    return ConnectionLostError(f"no answer from {address} within {timeout or 0:.1f}s")


class StreamContext:
    """An independent request line on a :class:`StreamClient` (same interface as
    :class:`fiber.wire.nng_client.ClientContext`)."""

    def __init__(self, client: StreamClient, line: int) -> None:
        self._client = client
        self._line = line

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        self.send(channel, payload)
        return self.recv(timeout)

    def send(self, channel: int, payload: bytes) -> None:
        self._client._send(self._line, request_frame(channel, payload))

    def send_request(self, request: bytes) -> None:
        """Send a whole request (:func:`~fiber.wire.framing.request_frame`'s bytes,
        made by the caller: a pool worker makes each result's with one concatenation)."""
        self._client._send(self._line, request)

    def recv(self, timeout: float | None = None) -> bytes:
        reply = self._client._wait(self._line, timeout)
        return check_reply(reply, self._client.address)

    def on_reply(self, hook: Callable[[bytes], bool] | None) -> None:
        """Have ``hook`` called with each reply of this line (the whole reply, its
        status byte first), in whichever thread reads it, instead of queueing it for
        :meth:`recv` unless the hook returns False; ``None`` removes it. For a line
        that no thread waits on (a pool worker's give line); the hook must not block."""
        if hook is None:
            self._client._hooks.pop(self._line, None)
        else:
            self._client._hooks[self._line] = hook

    def close(self) -> None:
        self._client._forget(self._line)
