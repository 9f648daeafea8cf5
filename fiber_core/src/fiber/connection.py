"""``Pipe``, ``Connection``, ``Listener``, ``Client`` and ``wait``: multiprocessing.connection
for processes that may run on other hosts.

**Pipes.** A pipe is a pair of mailboxes in the process that created it, one per
direction; ``Connection`` objects hold a side and reach the mailboxes directly or
through the creator's hub. Semantics follow :mod:`multiprocessing.connection`:
``send``/``recv`` of picklable objects, ``send_bytes``/``recv_bytes``/``recv_bytes_into``
of raw bytes, ``poll(timeout)``, ``EOFError`` when the other end is closed and nothing
is left, ``BrokenPipeError`` when sending to a closed end, ``OSError`` on a closed handle.

When is an end closed? When every handle of it is closed: the creator's local handle
by ``close()`` or garbage collection, each copy sent to another process when that
process closes it or exits. A copy sent to a fiber Process that ends before it
receives it is released when that process ends; a copy pickled for anything else
keeps the end open until it arrives somewhere. So the usual multiprocessing idiom (start a child with
``child_conn``, close ``child_conn`` in the parent, read until ``EOFError``) works.
A child started by the standard library holds an end as well: a spawned or forkserver
child once it unpickled it (its pickle brings the run's secret), a forked child from the
fork until it closes its copy or every process forked with it has exited
(:mod:`fiber.runtime.endpoint`); a forked child reaches the parent's mailboxes over the
hub's stream listener, since nng cannot be used after a fork.

``Connection.fileno()`` returns a descriptor that is readable while a message can be
received or the end is at EOF, wherever the mailbox lives (made on the first call, a
watcher keeps it true: :mod:`fiber.runtime.readiness`); so ``select``, :mod:`selectors`
and :func:`wait` work on pipe ends. An end read by several processes at once (which
multiprocessing warns against) may look readable after another process took the
message.

**Listener and Client** are multiprocessing's (sockets: ``AF_INET`` across hosts,
``AF_UNIX`` on one; the HMAC challenge; the connections they make are
:class:`multiprocessing.connection.Connection` objects) with two defaults of fiber's:
``authkey=None`` means the run's secret (every process of the run has it), where
multiprocessing does no authentication, since a listener reachable from a cluster's
network would otherwise unpickle what anyone sends; and a ``Listener`` given no address
(and no family, or ``AF_INET``) listens on the address the backend says jobs can
reach (:func:`fiber.runtime.run.listen_host`), port chosen by the system, since a job
may run on another host. ``wait``, ``families``, ``deliver_challenge`` and
``answer_challenge`` are multiprocessing's own: ``wait`` takes fiber Connections,
Process sentinels, sockets, multiprocessing's Connections and raw descriptors.
"""

from __future__ import annotations

import queue
import socket
import threading
import weakref
from collections.abc import Callable
from multiprocessing import connection as _mp_connection
from multiprocessing.connection import answer_challenge, deliver_challenge, wait
from typing import TYPE_CHECKING, Any

from fiber.errors import AuthenticationError, BufferTooShort
from fiber.runtime import readiness, run
from fiber.runtime.endpoint import Endpoint, fork_aware, hold_while_forked, keep_in_child
from fiber.runtime.mailbox import CLOSED, EMPTY, ITEM, SHARED, encode, reader_host
from fiber.runtime.managers.admission import MpAdmission, peer_name
from fiber.runtime.pipes import PipeChannel, record_transit
from fiber.wire import auth, serialization
from fiber.wire.gate import Gate
from fiber.wire.protocol import PIPE_SIDE as _SIDE
from fiber.wire.protocol import PIPE_TOKEN as _TOKEN
from fiber.wire.protocol import MailboxOp as Op
from fiber.wire.protocol import PipeOp

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

__all__ = ["Client", "Connection", "Listener", "Pipe", "answer_challenge",
           "deliver_challenge", "families", "wait"]

#: the address families of this platform, as multiprocessing.connection's
families: list[str] = _mp_connection.families  # type: ignore[attr-defined]  # missing from typeshed

_watch_lock = threading.Lock()  # makes each end's readiness descriptor once


def _rebuild(address: str, cid: int, side: int, readable: bool, writable: bool,
             token: int = 0, secret: bytes | None = None) -> Connection:
    auth.adopt(secret)  # a child started by multiprocessing: the run's secret
    conn = Connection(Endpoint(address, cid), side, readable, writable)
    if conn._channel is not None:  # back home: a local handle again
        conn._channel.drop_token(token)
    else:
        conn._request(encode(PipeOp.RECEIVED, 0, _TOKEN.pack(token)))
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
        self._watch: readiness.Watch | None = None  # fileno()'s descriptor, once asked
        self._watch_finalizer: weakref.finalize[[], Any] | None = None
        self._fork_token = 0  # in a forked child: the token of the copy it inherited
        channel = endpoint.local
        self._channel: PipeChannel | None = channel
        self._finalizer: weakref.finalize[[int], Connection] | None
        if channel is not None:
            with channel.lock:
                channel.local_handles[side] += 1
            self._finalizer = weakref.finalize(self, channel.release_local, side)
            self._finalizer.atexit = False  # children may use it until fiber's exit path
        else:
            self._finalizer = None
        fork_aware(self)

    def _before_fork(self) -> None:
        # the child about to be forked holds a copy of this end (as multiprocessing's
        # child inherits the descriptor): one more handle, until it registers the copy
        # or every process forked with it has exited
        channel = self._channel
        if channel is not None and not self._closed:
            token = self._fork_token = channel.new_token(self._side)
            hold_while_forked(lambda: channel.drop_token(token))

    def _after_fork_in_child(self) -> None:
        # the parent's handle stays the parent's: this copy reaches it through the wire
        for finalizer in (self._finalizer, self._watch_finalizer):
            if finalizer is not None:
                finalizer.detach()
        self._finalizer = self._watch_finalizer = None
        if self._watch is not None:
            keep_in_child(self._watch)  # its watcher belongs to the parent
        self._watch = None
        self._channel = None

    def __reduce__(self) -> tuple[Callable[..., Connection], tuple[Any, ...]]:
        if self._closed:
            raise OSError("handle is closed")
        token = 0
        if self._channel is not None:
            token = self._channel.new_token(self._side)
            record_transit(self._channel, token)
        return (_rebuild, (self._endpoint.address, self._endpoint.cid, self._side,
                           self._readable, self._writable, token, auth.for_stdlib_child()))

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
        """A descriptor that is readable while a message can be received (or the
        other end is closed and nothing is left): for ``select``, :mod:`selectors`
        and :func:`wait`. Made on the first call, closed with the end."""
        self._check_closed()
        watch = self._watch
        if watch is None:
            with _watch_lock:
                watch = self._watch
                if watch is None:
                    watch = self._new_watch()
        return watch.fileno()

    def _new_watch(self) -> readiness.Watch:
        watch: readiness.Watch
        if self._channel is not None:
            watch = readiness.LocalWatch(self._channel.boxes[self._side])
        else:
            endpoint = self._endpoint
            watch = readiness.RemoteWatch(endpoint.address, endpoint.cid,
                                          _SIDE.pack(self._side), self._request)
        self._watch = watch
        self._watch_finalizer = weakref.finalize(self, watch.close)
        self._watch_finalizer.atexit = False
        return watch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watch_finalizer is not None:
            self._watch_finalizer()
        if self._finalizer is not None:
            self._finalizer()
        else:
            try:
                self._request(encode(PipeOp.RELEASED, 0))
            except (ConnectionError, OSError):
                pass

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- I/O ------------------------------------------------------------------------
    def _request(self, payload: bytes, wait: float | None = None) -> bytes:
        if self._fork_token:  # a forked child's copy: now a handle held by this process
            token, self._fork_token = self._fork_token, 0
            self._endpoint.request(_SIDE.pack(self._side)
                                   + encode(PipeOp.RECEIVED, 0, _TOKEN.pack(token)))
        return self._endpoint.request(_SIDE.pack(self._side) + payload, wait)

    def send_bytes(self, buf: ReadableBuffer, offset: int = 0, size: int | None = None) -> None:
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

    def send(self, obj: Any) -> None:
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
        op = Op.PUT_SHARED if isinstance(data, serialization.Shared) else Op.PUT
        reply = self._request(encode(op, None, data))
        if reply[:1] == CLOSED:
            raise BrokenPipeError("the other end of the pipe is closed")

    def _check_watch(self) -> None:
        # the readiness watcher's thread died: wait() showed this end readable, which
        # may be a lie, so its reads raise the thread's error (as a queue's reader's)
        if self._watch is not None and self._watch.error is not None:
            raise self._watch.error

    def _get(self) -> bytes:
        self._check_closed()
        self._check_readable()
        self._check_watch()
        if self._channel is not None:
            return self._channel.boxes[self._side].get()
        reply = self._request(encode(Op.GET, None, reader_host()))
        if reply[:1] == ITEM:
            if self._watch is not None:
                self._watch.refresh()  # one message fewer: is another one waiting?
            return reply[1:]
        if reply[:1] == SHARED:
            if self._watch is not None:
                self._watch.refresh()
            return serialization.Shared(memoryview(reply)[1:])
        if reply[:1] == CLOSED:  # (after the kind: why, when a failure closed it)
            raise EOFError(bytes(reply[1:]).decode("utf-8", "replace"))
        raise OSError(f"unexpected reply {reply[:1]!r}")

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self._get_bytes()
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: WriteableBuffer, offset: int = 0) -> int:
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

    def recv(self) -> Any:
        return serialization.loads(self._get())

    def poll(self, timeout: float | None = 0.0) -> bool:
        self._check_closed()
        self._check_readable()
        self._check_watch()
        if self._channel is not None:
            return self._channel.boxes[self._side].poll(timeout)
        reply = self._request(encode(Op.POLL, timeout), timeout)
        return reply[:1] != EMPTY

    def __repr__(self) -> str:
        return (f"<fiber Connection side={self._side} of "
                f"{self._endpoint.address}#{self._endpoint.cid}>")


def Pipe(duplex: bool = True, *, ctx: Any = None) -> tuple[Connection, Connection]:
    """Two connected ends ``(conn1, conn2)``; with ``duplex=False`` conn1 only
    receives and conn2 only sends, as :func:`multiprocessing.Pipe`. ``ctx`` (fiber
    extension, passed by ``ctx.Pipe()``): the context whose jobs reach the pipe (None:
    the default context's)."""
    hub = run.of(ctx).hub()
    cid = hub.add_channel(PipeChannel(hub), stream=True)  # stream: for forked children
    first = Connection(Endpoint(hub.address, cid), 0, True, duplex)
    second = Connection(Endpoint(hub.address, cid), 1, duplex, True)
    return first, second


class Listener(_mp_connection.Listener):
    """:class:`multiprocessing.connection.Listener` with fiber's defaults: ``authkey``
    None is the run's secret, and with no ``address`` (family None or ``AF_INET``) it
    listens where the backend's jobs can reach it, on a port the system chooses."""

    def __init__(self, address: Any = None, family: str | None = None, backlog: int = 1,
                 authkey: bytes | None = None) -> None:
        if address is None and family in (None, "AF_INET"):
            address, family = (run.listen_host(), 0), "AF_INET"
        super().__init__(address, family, backlog,
                         auth.get_authkey() if authkey is None else authkey)

        self._gate: Gate | None = None
        inner = getattr(self, "_listener", None)
        key: bytes | None = getattr(self, "_authkey", None)
        if key and inner is not None and hasattr(inner, "_socket"):
            # strangers wait at a gate, not in accept(): see accept()
            self._key = key
            self._ready: queue.SimpleQueue[Any] = queue.SimpleQueue()
            self._gate = Gate("listener", self._admitted, on_death=self._gate_died)
            self._gate.listen(inner._socket, self._admission, self._renewed)

    def _renewed(self, old: socket.socket, new: socket.socket) -> None:
        """The gate listens on a new socket at the same address (the old one's
        descriptor was closed behind its back): :meth:`close` closes it."""
        inner: Any = getattr(self, "_listener", None)
        if inner is None or self._gate is None:
            new.close()  # closed meanwhile
            return
        inner._socket = new

    def _gate_died(self, error: BaseException) -> None:
        """Nothing can be admitted any more: accept() raises the error, clients
        connecting are refused at once."""
        self._ready.put(error)
        inner: Any = getattr(self, "_listener", None)
        try:
            inner._socket.close()
        except (AttributeError, OSError):
            pass

    def _admission(self, sock: socket.socket) -> MpAdmission:
        admission = MpAdmission(self._key, peer_name(sock), "a fiber Listener")
        address = _address_of(sock)
        admission.on_wrong_key = lambda: self._ready.put(
            AuthenticationError("digest received was wrong"))
        admission.address = address  # type: ignore[attr-defined]
        return admission

    def _admitted(self, sock: socket.socket, admission: Any) -> None:
        sock.setblocking(True)
        self._ready.put((_mp_connection.Connection(sock.detach()), admission.address))

    def accept(self) -> _mp_connection.Connection:
        """The next connection, authenticated as multiprocessing's ``accept()`` does,
        except that the handshakes run on a gate (:mod:`fiber.wire.gate`) rather than
        in this call: many clients authenticate at once, each within
        :data:`fiber.wire.gate.DEADLINE` seconds (10), with 256-byte messages, and a
        stranger that stays silent or sends what is not a handshake is closed without
        reaching this call. A client that answers with a wrong key raises
        :class:`multiprocessing.AuthenticationError` here, as multiprocessing's does.
        So no peer can hold up the clients behind it."""
        if self._gate is None:
            return super().accept()
        inner: Any = getattr(self, "_listener", None)
        if inner is None:
            raise OSError("listener is closed")
        got = self._ready.get()
        if got is None:
            self._ready.put(None)
            raise OSError("listener is closed")
        if isinstance(got, BaseException):
            raise got
        conn, address = got
        inner._last_accepted = address
        return conn

    def close(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._ready.put(None)
        super().close()


def _address_of(sock: socket.socket) -> Any:
    try:
        return sock.getpeername()
    except OSError:
        return None


def Client(address: Any, family: str | None = None,
           authkey: bytes | None = None) -> _mp_connection.Connection:
    """A connection to the :class:`Listener` at ``address``, as
    :func:`multiprocessing.connection.Client`; ``authkey`` None is the run's secret."""
    return _mp_connection.Client(address, family,
                                 auth.get_authkey() if authkey is None else authkey)
