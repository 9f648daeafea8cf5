"""One authenticated connection of a :class:`~fiber.wire.stream.server.StreamListener`,
seen from the listening side (:class:`_Connection`: frames read by the holder of its
reader token, replies written by any thread without blocking, what the socket cannot
take at once queued for the listener's selector thread), and the requests read from
it (:class:`StreamRequest`)."""

from __future__ import annotations

import collections
import itertools
import select
import socket
import threading
from collections.abc import Callable
from typing import Protocol

from fiber.wire.protocol import OK
from fiber.wire.stream.framing import BIG, READ_SIZE, allocate
from fiber.wire.stream.framing import FRAME as _FRAME

__all__ = ["Listening", "StreamRequest"]  # and _Connection

# peer numbers of stream connections start here, far above nng's 31-bit pipe ids
_peer_ids = itertools.count(1 << 40)

# each reading thread's buffer (READ_SIZE bytes), which a read copies out of at once:
# one per connection cost the master 64 KiB per connected worker (issue #29)
_buffers = threading.local()


def _read_buffer() -> bytearray:
    """The calling thread's read buffer (made on its first read)."""
    chunk: bytearray | None = getattr(_buffers, "chunk", None)
    if chunk is None:
        chunk = _buffers.chunk = bytearray(READ_SIZE)
    return chunk


class Listening(Protocol):
    """What a connection asks of its listener (a StreamListener)."""

    def want_write(self, conn: _Connection) -> None: ...

    def read_directly(self, conn: _Connection, done: Callable[[], bool],
                      timeout: float | None,
                      direct: Callable[[StreamRequest, bytes], bool] | None = None,
                      ) -> bool: ...


class StreamRequest:
    """A request received on a stream connection (a :class:`~fiber.wire.channel.Request`),
    which can also read its connection while it waits (:meth:`read_until`)."""

    __slots__ = ("_conn", "_line", "peer", "answered", "__weakref__")

    def __init__(self, conn: _Connection, line: int) -> None:
        self._conn = conn
        self._line = line
        self.peer = conn.peer
        self.answered = False

    def reply(self, data: bytes, status: bytes = OK) -> bool:
        """Send the reply; False when the requester is gone or it was answered."""
        if self.answered:
            return False
        self.answered = True
        return self._conn.send(self._line, status + data if data else status)

    def read_until(self, done: Callable[[], bool], timeout: float | None,
                   direct: Callable[[StreamRequest, bytes], bool] | None = None) -> bool:
        """Read and dispatch this request's connection on the calling thread until
        ``done()`` holds or ``timeout`` passes, offering each frame to ``direct``
        first (see :meth:`~fiber.wire.stream.server.StreamListener.read_directly`).
        False when it could not: another thread reads the connection, or it is gone."""
        return self._conn.listener.read_directly(self._conn, done, timeout, direct)


class _Connection:
    """One authenticated connection, seen from the listening side."""

    def __init__(self, listener: Listening, sock: socket.socket) -> None:
        self.listener = listener
        self.sock = sock
        self.peer = next(_peer_ids)
        self.closed = False
        self._inbuf = bytearray()
        self._big: bytearray | None = None  # body of a big frame being read
        self._big_line = 0
        self._big_got = 0
        self._out: collections.deque[memoryview] = collections.deque()
        self._wlock = threading.Lock()
        # held by the thread that reads (and dispatches, in order) this connection's
        # frames: the selector thread, or a caller waiting for a reply on it
        self.rlock = threading.Lock()
        # the poll object of the direct readers (made by the first, used by the holder
        # of rlock; StreamListener.read_directly) and the events it is registered for
        self.poller: select.poll | None = None
        self.poll_mask = 0

    # reading (by the holder of rlock)
    def read(self) -> list[tuple[int, bytes]]:
        """Frames that are complete now; raises :class:`ConnectionResetError` at the end,
        or when a frame announces a length that cannot be allocated (not a frame of
        fiber's: the connection is dropped, not the thread that reads it)."""
        frames: list[tuple[int, bytes]] = []
        chunk = _read_buffer()
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
                got = self.sock.recv_into(chunk)
            except (BlockingIOError, InterruptedError):
                return frames
            if not got:
                raise ConnectionResetError("connection closed")
            buf = self._inbuf
            if not buf and got < READ_SIZE and got >= _FRAME.size:
                # the usual case: one whole frame per read, taken from the read buffer
                # without passing the bytearray of what is left
                size, line = _FRAME.unpack_from(chunk)
                if got == _FRAME.size + size:
                    frames.append((line, bytes(memoryview(chunk)[_FRAME.size:got])))
                    return frames
            buf += memoryview(chunk)[:got]
            start = 0
            while len(buf) - start >= _FRAME.size:
                size, line = _FRAME.unpack_from(buf, start)
                end = start + _FRAME.size + size
                if end <= len(buf):
                    frames.append((line, bytes(buf[start + _FRAME.size:end])))
                    start = end
                    continue
                if size >= BIG:
                    body = allocate(size)
                    have = len(buf) - start - _FRAME.size
                    body[:have] = buf[start + _FRAME.size:]
                    self._big, self._big_line, self._big_got = body, line, have
                    start = len(buf)
                break
            del buf[:start]
            if got < READ_SIZE and self._big is None:
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
