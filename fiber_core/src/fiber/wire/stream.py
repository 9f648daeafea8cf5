"""A direct stream wire for latency-critical channels (the Pool's task lines).

pynng's request/reply costs about 250 us per round trip on a 2-core machine: every
message passes through nng's poller and task threads before the waiting Python thread
wakes. A plain TCP stream costs about 80 us. A hub therefore also serves channels that
opt in (``Hub.add_channel(..., stream=True)``) on a TCP listener of its own, with the
same semantics as the nng wire, so channels cannot tell the two apart:

- the same mutual HMAC challenge with the run's secret comes before anything else;
- many independent request lines ("contexts") share one connection: each frame
  carries its line's number, and a reply goes back on the line of its request;
- a request may be parked and answered later, from any thread, exactly once;
- a connection that drops reports ``peer_gone`` to the hub's channels.

A frame is ``length (8 bytes) + line (4 bytes) + body``; the body is the nng wire's
message (``b"M" + channel + payload`` for a request, a status byte + data for a reply).
The listening side reads every connection from one selector thread and writes from
whichever thread replies: without blocking, what the socket cannot take at once is left
to the selector thread. A thread that waits for a reply on one connection may take that
connection out of the selector and read it itself until its reply has come
(``StreamRequest.read_until``), which saves a thread wake-up per round trip; frames of
a connection are always dispatched in order, by whichever thread holds its reader
token. The connecting side (:class:`StreamClient`) uses blocking
sockets; the thread that waits for a reply reads frames for every line ("leader/
follower"), so there is no reader thread to hop through.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import select
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fiber.errors import AuthenticationError, ConnectionLostError
from fiber.wire import auth
from fiber.wire.framing import check_reply, request_frame
from fiber.wire.protocol import (
    AUTH1,
    AUTH3,
    AUTH_TIMEOUT,
    CONNECT_TIMEOUT,
    ERROR,
    OK,
)
from fiber.wire.protocol import STREAM_FRAME as _FRAME
from fiber.wire.protocol import STREAM_SCHEME as SCHEME

if TYPE_CHECKING:
    from fiber.wire.transport import Hub

logger = logging.getLogger("fiber")

_HANDSHAKE_MAX = 1024
_READ_SIZE = 64 * 1024  # read into a reused buffer: recv(n) would allocate n bytes
_BIG = 1 << 20  # frames from this size are read straight into their own buffer
_RECHECK = 0.1  # seconds between checks of a direct reader's condition
# peer numbers of stream connections start here, far above nng's 31-bit pipe ids
_peer_ids = itertools.count(1 << 40)


def _split(address: str) -> tuple[str, int, str | None]:
    """``stream://HOST:PORT[?local=NAME]`` -> host, port, local socket name."""
    if not address.startswith(SCHEME):
        raise ValueError(f"not a stream address: {address!r}")
    rest, _, query = address[len(SCHEME):].partition("?")
    host, _, port = rest.rpartition(":")
    local = query[len("local="):] if query.startswith("local=") else None
    return host.strip("[]"), int(port), local or None


def _connect(host: str, port: int, local: str | None, timeout: float) -> socket.socket:
    """The listener's local (Unix, abstract) socket when this process shares its host
    and network namespace, else TCP."""
    if local and hasattr(socket, "AF_UNIX"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + local)
            return sock
        except OSError:
            sock.close()  # another host or namespace: TCP it is
    sock = socket.create_connection((host, port), timeout=timeout)
    _nodelay(sock)
    return sock


def _nodelay(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not TCP
        pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    """Blocking read of exactly ``n`` bytes (handshakes only)."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed")
        data += chunk
    return bytes(data)


def _read_frame_blocking(sock: socket.socket, limit: int) -> tuple[int, bytes]:
    size, line = _FRAME.unpack(_recv_exact(sock, _FRAME.size))
    if size > limit:
        raise ConnectionResetError(f"frame of {size} bytes during the handshake")
    return line, _recv_exact(sock, size)


def _frame(line: int, body: bytes) -> bytes:
    return _FRAME.pack(len(body), line) + body


# -- the listening side ---------------------------------------------------------------
class StreamRequest:
    """A request received on a stream connection; same interface as
    :class:`fiber.wire.transport.Request`."""

    __slots__ = ("_conn", "_line", "peer", "answered", "__weakref__")

    def __init__(self, conn: _Connection, line: int) -> None:
        self._conn = conn
        self._line = line
        self.peer = conn.peer
        self.answered = False

    def reply(self, data: bytes, status: bytes = b"\x00") -> bool:
        """Send the reply; False when the requester is gone or it was answered."""
        if self.answered:
            return False
        self.answered = True
        return self._conn.send(self._line, status + data if data else status)

    def read_until(self, done: Callable[[], bool], timeout: float | None) -> bool:
        """Read and dispatch this request's connection on the calling thread until
        ``done()`` holds or ``timeout`` passes (see :meth:`StreamListener.read_directly`).
        False when it could not: another thread reads the connection, or it is gone."""
        return self._conn.listener.read_directly(self._conn, done, timeout)


class _Connection:
    """One authenticated connection, seen from the listening side."""

    def __init__(self, listener: StreamListener, sock: socket.socket) -> None:
        self.listener = listener
        self.sock = sock
        self.peer = next(_peer_ids)
        self.closed = False
        self._inbuf = bytearray()
        self._chunk = bytearray(_READ_SIZE)
        self._big: bytearray | None = None  # body of a big frame being read
        self._big_line = 0
        self._big_got = 0
        self._out: collections.deque[memoryview] = collections.deque()
        self._wlock = threading.Lock()
        # held by the thread that reads (and dispatches, in order) this connection's
        # frames: the selector thread, or a caller waiting for a reply on it
        self.rlock = threading.Lock()

    # reading (by the holder of rlock)
    def read(self) -> list[tuple[int, bytes]]:
        """Frames that are complete now; raises ConnectionResetError at the end."""
        frames: list[tuple[int, bytes]] = []
        while True:
            if self._big is not None:
                view = memoryview(self._big)[self._big_got:]
                try:
                    n = self.sock.recv_into(view)
                except (BlockingIOError, InterruptedError):
                    return frames
                if n == 0:
                    raise ConnectionResetError("connection closed")
                self._big_got += n
                if self._big_got == len(self._big):
                    frames.append((self._big_line, bytes(self._big)))
                    self._big = None
                continue
            try:
                got = self.sock.recv_into(self._chunk)
            except (BlockingIOError, InterruptedError):
                return frames
            if not got:
                raise ConnectionResetError("connection closed")
            buf = self._inbuf
            buf += memoryview(self._chunk)[:got]
            start = 0
            while len(buf) - start >= _FRAME.size:
                size, line = _FRAME.unpack_from(buf, start)
                end = start + _FRAME.size + size
                if end <= len(buf):
                    frames.append((line, bytes(buf[start + _FRAME.size:end])))
                    start = end
                    continue
                if size >= _BIG:
                    body = bytearray(size)
                    have = len(buf) - start - _FRAME.size
                    body[:have] = buf[start + _FRAME.size:]
                    self._big, self._big_line, self._big_got = body, line, have
                    start = len(buf)
                break
            del buf[:start]
            if got < _READ_SIZE and self._big is None:
                return frames

    # writing (any thread)
    def send(self, line: int, body: bytes) -> bool:
        header = _FRAME.pack(len(body), line)
        with self._wlock:
            if self.closed:
                return False
            if self._out:
                self._out.append(memoryview(header))
                self._out.append(memoryview(body))
                return True
            parts = [header + body] if len(body) < 65536 else [header, body]
            try:
                sent = self.sock.sendmsg(parts)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return False
            total = _FRAME.size + len(body)
            if sent == total:
                return True
            for part in parts:
                view = memoryview(part)
                if sent >= len(view):
                    sent -= len(view)
                    continue
                self._out.append(view[sent:])
                sent = 0
        self.listener.want_write(self)
        return True

    def flush(self) -> bool:
        """Write what is queued; True when nothing is left (selector thread)."""
        with self._wlock:
            while self._out:
                view = self._out[0]
                try:
                    n = self.sock.send(view)
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError:  # the peer is gone: reading will find out and drop it
                    self._out.clear()
                    return True
                if n < len(view):
                    self._out[0] = view[n:]
                    return False
                self._out.popleft()
            return True

    def close(self) -> None:
        with self._wlock:
            self.closed = True
            self._out.clear()
        try:
            self.sock.close()
        except OSError:
            pass


class StreamListener:
    """Accepts stream connections for a hub and feeds their requests to it."""

    def __init__(self, hub: Hub, host: str) -> None:
        self._hub = hub
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self._sock.listen(512)
        self._sock.setblocking(False)
        port = self._sock.getsockname()[1]
        bracketed = f"[{host}]" if ":" in host else host
        self.address = f"{SCHEME}{bracketed}:{port}"
        # processes on this host (same network namespace) connect to an abstract Unix
        # socket instead: about half the system time of TCP over loopback per message
        self._local: socket.socket | None = None
        if sys.platform.startswith("linux"):
            name = f"fiber-stream-{os.getpid()}-{os.urandom(8).hex()}"
            self._local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._local.bind("\0" + name)
            self._local.listen(512)
            self._local.setblocking(False)
            self.address += f"?local={name}"
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        if self._local is not None:
            self._selector.register(self._local, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._joining: list[_Connection] = []  # authenticated, to be registered
        self._writers: set[_Connection] = set()
        self._conns: set[_Connection] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="fiber-stream", daemon=True)
        self._thread.start()
        logger.debug("stream listener on %s", self.address)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass  # a wake-up is pending already, or we are closing

    def want_write(self, conn: _Connection) -> None:
        with self._lock:
            self._writers.add(conn)
        self._wake()

    # -- accepting ----------------------------------------------------------------
    def _accept(self, listening: socket.socket) -> None:
        while True:
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(sock,), daemon=True,
                             name="fiber-stream-auth").start()

    def _handshake(self, sock: socket.socket) -> None:
        """The hub's half of the mutual challenge, on a thread of its own so that a
        slow or silent client cannot stall the others."""
        key = self._hub.authkey
        try:
            sock.setblocking(True)
            sock.settimeout(AUTH_TIMEOUT)
            _nodelay(sock)
            line, data = _read_frame_blocking(sock, _HANDSHAKE_MAX)
            if data[:2] != AUTH1 or len(data) != 2 + auth.NONCE_SIZE:
                raise AuthenticationError("bad first message")
            nonce = auth.new_nonce()
            sock.sendall(_frame(line, OK + nonce
                                + auth.answer(key, b"hub", data[2:])))
            line, data = _read_frame_blocking(sock, _HANDSHAKE_MAX)
            if data[:2] != AUTH3 or not auth.verify(key, b"client", nonce, data[2:]):
                raise AuthenticationError("wrong answer")
            sock.sendall(_frame(line, OK))
        except (OSError, AuthenticationError) as exc:
            logger.warning("rejected a stream connection that did not prove the run's "
                           "secret (%s)", exc)
            try:
                sock.sendall(_frame(0, ERROR + b"authentication failed"))
            except OSError:
                pass
            sock.close()
            return
        sock.settimeout(None)
        sock.setblocking(False)
        conn = _Connection(self, sock)
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._joining.append(conn)
        self._wake()

    # -- the selector thread --------------------------------------------------------
    def _run(self) -> None:
        sel = self._selector
        while not self._closed:
            try:
                events = sel.select()
            except OSError:
                if self._closed:
                    return
                raise
            for key, mask in events:
                obj = key.fileobj
                if obj is self._sock or obj is self._local:
                    self._accept(obj)
                elif obj == self._wake_r:
                    self._drain_wake()
                else:
                    conn: _Connection = key.data
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        if conn.flush():
                            self._watch(conn, write=False)
                    if mask & selectors.EVENT_READ and not conn.closed:
                        self._readable(conn)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        with self._lock:
            joining, self._joining = self._joining, []
            writers, self._writers = self._writers, set()
        for conn in joining:
            self._conns.add(conn)
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        for conn in writers:
            if not conn.closed and conn in self._conns:
                self._watch(conn, write=not conn.flush())

    def _watch(self, conn: _Connection, write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        with self._lock:
            try:
                self._selector.modify(conn.sock, events, conn)
            except (KeyError, ValueError, OSError):
                pass  # closed, or read directly by a caller (which restores it)

    def _readable(self, conn: _Connection) -> None:
        if not conn.rlock.acquire(False):
            return  # a caller reads it directly (an event from before it took over)
        try:
            self._read_and_dispatch(conn)
        finally:
            conn.rlock.release()

    def _read_and_dispatch(self, conn: _Connection) -> bool:
        """Dispatch the frames that are complete now (holding conn.rlock, so that they
        are dispatched in the order they came); False when the connection ended."""
        try:
            frames = conn.read()
        except OSError:
            self._drop(conn)
            return False
        for line, body in frames:
            self._hub.dispatch(StreamRequest(conn, line), body, stream=True)
        return True

    def read_directly(self, conn: _Connection, done: Callable[[], bool],
                      timeout: float | None) -> bool:
        """Let the calling thread, which waits for a reply to come on ``conn``, read
        that connection itself until ``done()`` holds or ``timeout`` passes: the reply
        is then dispatched on the thread that waits for it, and the hop from the
        selector thread (a thread wake-up, about a fifth of a pool's round trip) is
        saved. The connection leaves the selector meanwhile and returns to it after.
        False when another thread is reading the connection or it is gone (the
        caller then waits as usual)."""
        if conn.closed or not conn.rlock.acquire(False):
            return False
        with self._lock:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                conn.rlock.release()  # closed meanwhile
                return False
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(conn.sock, select.POLLIN)
        alive = True
        try:
            while not done():
                # done() is checked again at least every _RECHECK seconds: what it waits
                # for may happen elsewhere (its task moved to another connection)
                wait = _RECHECK
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, left)
                wait = math.ceil(wait * 1000)
                # what this thread's replies could not write at once is written here
                # too: the selector does not watch the connection meanwhile
                poller.modify(conn.sock, select.POLLIN | (select.POLLOUT if conn._out else 0))
                events = poller.poll(wait)
                if not events:
                    continue
                if events[0][1] & select.POLLOUT:
                    conn.flush()
                if events[0][1] & ~select.POLLOUT and not self._read_and_dispatch(conn):
                    alive = False
                    break
        finally:
            with self._lock:
                conn.rlock.release()
                if alive and not conn.closed and not self._closed:
                    events = selectors.EVENT_READ | (
                        selectors.EVENT_WRITE if conn._out else 0)
                    try:
                        self._selector.register(conn.sock, events, conn)
                    except (KeyError, ValueError, OSError):
                        pass
        return True

    def _drop(self, conn: _Connection) -> None:
        with self._lock:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        self._conns.discard(conn)
        conn.close()
        self._hub.peer_lost(conn.peer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake()
        for conn in list(self._conns):
            conn.close()
        for sock in (self._sock, self._local):
            try:
                if sock is not None:
                    sock.close()
            except OSError:
                pass


# -- the connecting side --------------------------------------------------------------
class StreamClient:
    """A connection to a hub's stream listener, with the interface of
    :class:`fiber.wire.transport.Client` (``request``, ``context``, ``lost``, ``close``)."""

    def __init__(self, address: str, authkey: bytes | None = None,
                 on_lost: Callable[[], None] | None = None) -> None:
        self.address = address
        self._key = authkey or auth.get_authkey()
        self._on_lost = on_lost
        self.lost = False
        host, port, local = _split(address)
        try:
            self._sock = _connect(host, port, local, CONNECT_TIMEOUT)
        except OSError as exc:
            raise ConnectionLostError(
                f"cannot connect to the fiber process at {address}: {exc} "
                "(it has exited, or this host cannot reach that address; see the "
                "listen_address setting)") from None
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[int, collections.deque[bytes]] = {}
        self._reading = False
        self._rbuf = bytearray()
        self._chunk = bytearray(_READ_SIZE)
        self._lines = itertools.count(1)
        self._handshake()
        self._sock.settimeout(None)
        self._default = self.context()
        self._default_lock = threading.Lock()

    def _handshake(self) -> None:
        try:
            nonce = auth.new_nonce()
            self._sock.sendall(_frame(0, AUTH1 + nonce))
            _, reply = _read_frame_blocking(self._sock, _HANDSHAKE_MAX)
            if reply[:1] != OK or not auth.verify(
                    self._key, b"hub", nonce, reply[1 + auth.NONCE_SIZE:]):
                raise AuthenticationError(
                    f"the process at {self.address} does not hold this run's secret")
            hub_nonce = reply[1:1 + auth.NONCE_SIZE]
            self._sock.sendall(_frame(0, AUTH3
                                      + auth.answer(self._key, b"client", hub_nonce)))
            _, reply = _read_frame_blocking(self._sock, _HANDSHAKE_MAX)
            if reply[:1] != OK:
                raise AuthenticationError(
                    f"the process at {self.address} rejected this run's secret")
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
        and hands other lines' replies to their waiters."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                while True:
                    queue = self._replies.get(line)
                    if queue:
                        return queue.popleft()
                    if self.lost:
                        raise ConnectionLostError(f"the connection to {self.address} is lost")
                    if not self._reading:
                        self._reading = True
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise _timeout(self.address, timeout)
                    self._cond.wait(left)
            try:
                frame = self._read_frame(deadline)
            except TimeoutError:
                with self._cond:
                    self._reading = False
                    self._cond.notify_all()
                raise _timeout(self.address, timeout) from None
            except OSError:
                with self._cond:
                    self._reading = False
                self._lose()
                raise ConnectionLostError(f"the connection to {self.address} is lost") from None
            with self._cond:
                self._reading = False
                got_line, body = frame
                queue = self._replies.get(got_line)
                if queue is not None:
                    queue.append(body)
                self._cond.notify_all()

    def _read_frame(self, deadline: float | None) -> tuple[int, bytes]:
        buf = self._rbuf
        if deadline is not None and not buf:
            import select

            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._sock], [], [], left)
            if not ready:
                raise TimeoutError
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
        body = bytearray(size)
        have = len(buf) - _FRAME.size
        body[:have] = buf[_FRAME.size:]
        buf.clear()
        view = memoryview(body)
        while have < size:
            n = self._sock.recv_into(view[have:])
            if n == 0:
                raise ConnectionResetError("connection closed")
            have += n
        return line, bytes(body)

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
    :class:`fiber.wire.transport.ClientContext`)."""

    def __init__(self, client: StreamClient, line: int) -> None:
        self._client = client
        self._line = line

    def request(self, channel: int, payload: bytes, timeout: float | None = None) -> bytes:
        self.send(channel, payload)
        return self.recv(timeout)

    def send(self, channel: int, payload: bytes) -> None:
        self._client._send(self._line, request_frame(channel, payload))

    def recv(self, timeout: float | None = None) -> bytes:
        reply = self._client._wait(self._line, timeout)
        return check_reply(reply, self._client.address)

    def close(self) -> None:
        self._client._forget(self._line)
