"""``Pipe`` and ``Connection``: two connected ends usable from any processes.

A pipe is a pair of mailboxes in the process that created it, one per direction;
``Connection`` objects hold a side and reach the mailboxes directly or through the
creator's hub. Semantics follow :mod:`multiprocessing.connection`: ``send``/``recv``
of picklable objects, ``send_bytes``/``recv_bytes``/``recv_bytes_into`` of raw bytes,
``poll(timeout)``, ``EOFError`` when the other end is closed and nothing is left,
``BrokenPipeError`` when sending to a closed end, ``OSError`` on a closed handle.

When is an end closed? When every handle of it is closed: the creator's local handle
by ``close()`` or garbage collection, each copy sent to another process when that
process closes it or exits. A copy sent to a fiber Process that ends before it
receives it is released when that process ends; a copy pickled for anything else
keeps the end open until it arrives somewhere. So the usual multiprocessing idiom (start a child with
``child_conn``, close ``child_conn`` in the parent, read until ``EOFError``) works.
"""

from __future__ import annotations

import contextlib
import itertools
import struct
import threading
import weakref
from collections.abc import Iterator

from fiber import serialization, transport
from fiber.endpoint import Endpoint
from fiber.errors import BufferTooShort
from fiber.mailbox import CLOSED, EMPTY, ITEM, SHARED, Mailbox, decode, encode, reader_host

__all__ = ["Pipe", "Connection"]

_SIDE = struct.Struct("<B")
_TOKEN = struct.Struct("<Q")
_tokens = itertools.count(1)
_recording = threading.local()


@contextlib.contextmanager
def recording_transit() -> Iterator[list]:
    """Collect the pipe ends pickled in this block (the payload of a Process), so that
    they can be released if that process ends before receiving them."""
    previous = getattr(_recording, "log", None)
    _recording.log = log = []
    try:
        yield log
    finally:
        _recording.log = previous


def release_transit(log: list) -> None:
    """The process that was to receive these copies has ended."""
    for channel, token in log:
        channel.drop_token(token)


class PipeChannel:
    """Two mailboxes; side ``i`` reads ``boxes[i]`` and writes ``boxes[1 - i]``."""

    def __init__(self, hub: transport.Hub) -> None:
        self.boxes = (Mailbox(hub), Mailbox(hub))
        self.local_handles = [0, 0]
        self.in_transit: dict[int, int] = {}  # token of a pickled copy -> its side
        self.remote_peers: list[dict[int, int]] = [{}, {}]  # peer -> handles it holds
        self.lock = threading.Lock()

    def close_side(self, side: int) -> None:
        self.boxes[1 - side].close()  # the other end reads EOF once drained
        with self.boxes[side].lock:
            self.boxes[side].reader_closed = True  # the other end's sends fail
        self.boxes[side].discard()  # nobody will read what is left (shared segments)

    def _unused(self, side: int) -> bool:
        return (self.local_handles[side] == 0 and side not in self.in_transit.values()
                and not self.remote_peers[side])

    def new_token(self, side: int) -> int:
        with self.lock:
            token = next(_tokens)
            self.in_transit[token] = side
            return token

    def drop_token(self, token: int) -> None:
        """A pickled copy will never arrive (or arrived as a local handle)."""
        with self.lock:
            side = self.in_transit.pop(token, None)
            last = side is not None and self._unused(side)
        if last:
            self.close_side(side)

    def release_local(self, side: int) -> None:
        with self.lock:
            self.local_handles[side] -= 1
            last = self._unused(side)
        if last:
            self.close_side(side)

    def _release_remote(self, side: int, peer: int, everything: bool = False) -> None:
        with self.lock:
            held = self.remote_peers[side].get(peer, 0)
            if everything or held <= 1:
                self.remote_peers[side].pop(peer, None)
            else:
                self.remote_peers[side][peer] = held - 1
            last = self._unused(side)
        if last:
            self.close_side(side)

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        side = payload[0]
        op, timeout, data = decode(payload[1:])
        if op == b"T":  # a process received a copy of this end
            with self.lock:
                self.in_transit.pop(_TOKEN.unpack_from(data)[0], None)
                peers = self.remote_peers[side]
                peers[request.peer] = peers.get(request.peer, 0) + 1
            request.reply(b"")
        elif op == b"X":
            self._release_remote(side, request.peer)
            request.reply(b"")
        elif op == b"P" or op == b"Q":
            self.boxes[1 - side].handle(request, op, timeout, data)
        else:
            self.boxes[side].handle(request, op, timeout, data)

    def peer_gone(self, peer: int) -> None:
        for side in (0, 1):
            self.boxes[side].peer_gone(peer)
            if peer in self.remote_peers[side]:
                self._release_remote(side, peer, everything=True)


def _rebuild(address: str, cid: int, side: int, readable: bool, writable: bool,
             token: int = 0):
    conn = Connection(Endpoint(address, cid), side, readable, writable)
    if conn._channel is not None:  # back home: a local handle again
        conn._channel.drop_token(token)
    else:
        conn._request(encode(b"T", 0, _TOKEN.pack(token)))
    return conn


class Connection:
    """One end of a :func:`Pipe`."""

    def __init__(self, endpoint: Endpoint, side: int, readable: bool = True,
                 writable: bool = True) -> None:
        self._endpoint = endpoint
        self._side = side
        self._readable = readable
        self._writable = writable
        self._closed = False
        channel = endpoint.local
        self._channel: PipeChannel | None = channel
        if channel is not None:
            with channel.lock:
                channel.local_handles[side] += 1
            self._finalizer = weakref.finalize(self, channel.release_local, side)
        else:
            self._finalizer = None

    def __reduce__(self):
        if self._closed:
            raise OSError("handle is closed")
        token = 0
        if self._channel is not None:
            token = self._channel.new_token(self._side)
            log = getattr(_recording, "log", None)
            if log is not None:
                log.append((self._channel, token))
        return (_rebuild, (self._endpoint.address, self._endpoint.cid, self._side,
                           self._readable, self._writable, token))

    # -- state ----------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def readable(self) -> bool:
        return self._readable

    @property
    def writable(self) -> bool:
        return self._writable

    def _check_closed(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def _check_readable(self) -> None:
        if not self._readable:
            raise OSError("connection is write-only")

    def _check_writable(self) -> None:
        if not self._writable:
            raise OSError("connection is read-only")

    def fileno(self) -> int:
        raise OSError("a fiber Connection has no file descriptor; use poll()")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()
        else:
            try:
                self._request(encode(b"X", 0))
            except (ConnectionError, OSError):
                pass

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- I/O ------------------------------------------------------------------------
    def _request(self, payload: bytes, wait: float | None = None) -> bytes:
        return self._endpoint.request(_SIDE.pack(self._side) + payload, wait)

    def send_bytes(self, buf, offset: int = 0, size: int | None = None) -> None:
        self._check_closed()
        self._check_writable()
        view = memoryview(buf).cast("B")
        if offset < 0:
            raise ValueError("offset is negative")
        if offset > len(view):
            raise ValueError("buffer length < offset")
        if size is None:
            size = len(view) - offset
        if size < 0:
            raise ValueError("size is negative")
        if offset + size > len(view):
            raise ValueError("buffer length < offset + size")
        self._put(bytes(view[offset:offset + size]))

    def send(self, obj) -> None:
        self._check_closed()
        self._check_writable()
        data = serialization.dumps(obj, self._shm_owner)
        try:
            self._put(data)
        except BaseException:
            serialization.discard(data)  # not accepted: its segment is still ours
            raise

    def _shm_owner(self) -> int | None:
        return self._endpoint.shm_owner(_SIDE.pack(self._side))

    def _put(self, data: bytes) -> None:
        if self._channel is not None:
            if self._channel.boxes[self._side].reader_closed:
                raise BrokenPipeError("the other end of the pipe is closed")
            self._channel.boxes[1 - self._side].put(data)
            return
        op = b"Q" if isinstance(data, serialization.Shared) else b"P"
        reply = self._request(encode(op, None, data))
        if reply[:1] == CLOSED:
            raise BrokenPipeError("the other end of the pipe is closed")

    def _get(self) -> bytes:
        self._check_closed()
        self._check_readable()
        if self._channel is not None:
            return self._channel.boxes[self._side].get()
        reply = self._request(encode(b"G", None, reader_host()))
        if reply[:1] == ITEM:
            return reply[1:]
        if reply[:1] == SHARED:
            return serialization.Shared(memoryview(reply)[1:])
        if reply[:1] == CLOSED:
            raise EOFError
        raise OSError(f"unexpected reply {reply[:1]!r}")

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self._get_bytes()
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf, offset: int = 0) -> int:
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset out of bounds" if offset >= 0 else "negative offset")
        data = self._get_bytes()
        if len(data) > len(view) - offset:
            raise BufferTooShort(data)
        view[offset:offset + len(data)] = data
        return len(data)

    def _get_bytes(self) -> bytes:
        """A message as bytes (an object sent with shared memory: the plain pickle)."""
        data = self._get()
        return serialization.inline(data) if isinstance(data, serialization.Shared) else data

    def recv(self):
        return serialization.loads(self._get())

    def poll(self, timeout: float | None = 0.0) -> bool:
        self._check_closed()
        self._check_readable()
        if self._channel is not None:
            return self._channel.boxes[self._side].poll(timeout)
        reply = self._request(encode(b"L", timeout), timeout)
        return reply[:1] != EMPTY

    def __repr__(self) -> str:
        return (f"<fiber Connection side={self._side} of "
                f"{self._endpoint.address}#{self._endpoint.cid}>")


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """Two connected ends ``(conn1, conn2)``; with ``duplex=False`` conn1 only
    receives and conn2 only sends, as :func:`multiprocessing.Pipe`."""
    hub = transport.get_hub()
    cid = hub.add_channel(PipeChannel(hub))
    first = Connection(Endpoint(hub.address, cid), 0, True, duplex)
    second = Connection(Endpoint(hub.address, cid), 1, duplex, True)
    return first, second
