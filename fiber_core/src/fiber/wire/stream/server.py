"""The listening side of the stream wire: a hub's :class:`StreamListener`.

It accepts connections on TCP and (Linux) an abstract Unix socket through a
:class:`~fiber.wire.gate.Gate`, which runs the hub's half of the handshake
(:class:`~fiber.wire.handshake.HubHandshake`) for every new connection from one thread,
with bounded memory, a deadline and a cap on connections still authenticating (a
stranger costs no thread and cannot stall the others), then reads every
authenticated connection from one selector thread and hands each request to the hub
(``dispatch``) as a :class:`StreamRequest` (connections and requests:
:mod:`fiber.wire.stream.accepted`). Replies are written by whichever thread
answers, without blocking: what the socket cannot take at once is left to the selector
thread. A thread that waits for a reply on one connection may take that connection out
of the selector and read it itself until its reply has come
(:meth:`StreamRequest.read_until`), which saves a thread wake-up per round trip; frames
of a connection are always dispatched in order, by whichever thread holds its reader
token.
"""

from __future__ import annotations

import logging
import math
import os
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

from fiber import threads
from fiber.errors import FiberThreadError
from fiber.wire.channel import Request
from fiber.wire.gate import Admission, FramedAdmission, Gate
from fiber.wire.handshake import HubHandshake
from fiber.wire.protocol import AUTH_REFUSED, AUTH_TIMEOUT
from fiber.wire.stream.accepted import StreamRequest, _Connection
from fiber.wire.stream.framing import FRAME as _FRAME
from fiber.wire.stream.framing import (
    HANDSHAKE_MAX,
    SCHEME,
    frame,
    nodelay,
)

__all__ = ["StreamAdmission", "StreamListener", "StreamRequest"]

logger = logging.getLogger("fiber")

_RECHECK = 0.1  # seconds between checks of a direct reader's condition
_RECHECK_MS = math.ceil(_RECHECK * 1000)
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
# a connection a caller read directly stays out of the selector this long after (so that
# a loop of get()s does not pay two epoll_ctl each): the selector takes it back when it
# has been left alone this long, within twice this time
_PARK = 0.002


_selector_thread = threading.local()


def on_selector_thread() -> bool:
    """Whether the calling thread is a listener's selector thread, which reads every
    connection of its hub: a handler on it must not wait long (a channel whose lock is
    busy hands its work to another thread, :mod:`fiber.runtime.pool.lines`)."""
    return getattr(_selector_thread, "on", False)


#: how a listener hands a request to its hub: ``dispatch(request, body, True)``
Dispatch = Callable[[Request, bytes, bool], None]
#: what a direct reader offers each frame it reads first: True when it handled it
Direct = Callable[[StreamRequest, bytes], bool]


class StreamListener:
    """Accepts stream connections on ``host`` for a hub: authenticates them with
    ``authkey``, hands their requests to ``dispatch`` and reports each connection that
    ends to ``peer_lost`` (with its peer number); ``peer_joined`` (if given) hears of
    each connection once authenticated, before any of its requests."""

    def __init__(self, host: str, authkey: bytes, dispatch: Dispatch,
                 peer_lost: Callable[[int], None],
                 peer_joined: Callable[[int], None] | None = None) -> None:
        self._key = authkey
        self._dispatch = dispatch
        self._peer_lost = peer_lost
        self._peer_joined = peer_joined
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
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._joining: list[_Connection] = []  # authenticated, to be registered
        self._writers: set[_Connection] = set()
        # connections out of the selector since a direct read ended, and when it ended
        self._parked: dict[_Connection, float] = {}
        self._conns: set[_Connection] = set()
        self._closed = False
        # strangers are held at the gate until they prove the run's secret
        self.failure: BaseException | None = None  # why it stopped admitting, if it did
        self.gate = Gate("stream", self._admitted, deadline=AUTH_TIMEOUT,
                         on_death=self._gate_died)
        for listening in (self._sock, self._local):
            if listening is not None:
                self.gate.listen(listening, self._admission, self._renewed)
        # (started last: if it dies at once, what it closes is all made)
        self._thread = threads.start("fiber-stream", self._run, fails=self._selector_died)
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

    def _renewed(self, old: socket.socket, new: socket.socket) -> None:
        """The gate listens on a new socket (the old one's descriptor was closed
        behind its back): this listener closes the new one when it closes."""
        if old is self._sock:
            self._sock = new
        elif old is self._local:
            self._local = new
        if self._closed:
            new.close()

    def check(self) -> None:
        """Raise why this listener stopped admitting, if it did (after its gate had a
        chance to listen again on a socket whose descriptor was closed behind its
        back): called before a job that will connect here is started."""
        self.gate.check()
        if self.failure is not None:
            raise self.failure

    def _gate_died(self, error: BaseException) -> None:
        """No connection can be admitted any more: close the listening sockets, so
        that jobs connecting are refused at once (their start fails naming this)."""
        self.failure = error
        for listening in (self._sock, self._local):
            if listening is not None:
                try:
                    listening.close()
                except OSError:
                    pass

    def _selector_died(self, error: FiberThreadError) -> None:
        """No connection is read any more: stop admitting (as :meth:`_gate_died`) and
        close every connection, so that its peer's calls fail at once instead of
        waiting for replies nobody reads requests for."""
        self._gate_died(error)
        self.gate.close()
        with self._lock:
            self._closed = True  # (a connection admitted from now on is closed at once)
            conns = list(self._conns) + self._joining
            self._joining = []
            self._parked.clear()
        for conn in conns:
            self._conns.discard(conn)
            conn.close()
            self._peer_lost(conn.peer)

    # -- admitting (on the gate's thread) ----------------------------------------------
    def _admission(self, sock: socket.socket) -> StreamAdmission:
        nodelay(sock)
        return StreamAdmission(HubHandshake(self._key, _peer_name(sock)))

    def _admitted(self, sock: socket.socket, admission: Admission) -> None:
        """An authenticated connection joins the selector."""
        conn = _Connection(self, sock)
        with self._lock:
            if self._closed:
                sock.close()
                return
            if self._peer_joined is not None:
                self._peer_joined(conn.peer)
            self._joining.append(conn)
        self._wake()

    # -- the selector thread --------------------------------------------------------
    def _run(self) -> None:
        _selector_thread.on = True
        sel = self._selector
        while not self._closed:
            try:
                events = sel.select(_PARK if self._parked else None)
            except OSError:
                if self._closed:
                    return
                raise
            for key, mask in events:
                obj = key.fileobj
                if obj == self._wake_r:
                    self._drain_wake()
                else:
                    conn: _Connection = key.data
                    if mask & selectors.EVENT_WRITE and not conn.closed:
                        if conn.flush():
                            self._watch(conn, write=False)
                    if mask & selectors.EVENT_READ and not conn.closed:
                        self._readable(conn)
            if self._parked:
                self._unpark()

    def _unpark(self) -> None:
        """Put back in the selector the connections no caller has read directly for
        ``_PARK`` seconds (one a caller reads now stays out: that caller returns it)."""
        now = time.monotonic()
        with self._lock:
            for conn, since in list(self._parked.items()):
                if conn.closed:
                    del self._parked[conn]
                    continue
                if now - since < _PARK or not conn.rlock.acquire(False):
                    continue
                try:
                    self._selector.register(conn.sock, selectors.EVENT_READ | (
                        selectors.EVENT_WRITE if conn._out else 0), conn)
                except (KeyError, ValueError, OSError):
                    pass
                finally:
                    # (unlisted with the token held: a direct reader reads the list
                    # without the lock, read_directly)
                    del self._parked[conn]
                    conn.rlock.release()

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
            self._join(conn)
        for conn in writers:
            if not conn.closed and conn in self._conns:
                self._watch(conn, write=not conn.flush())

    def _join(self, conn: _Connection) -> None:
        """Put a newly authenticated connection in the selector. An entry of the
        selector with its number is a connection whose descriptor was closed behind
        this listener's back (the kernel gives the lowest free number to the next
        socket): that connection is dropped, its number left alone."""
        try:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            return
        except KeyError:
            key = self._selector.get_map().get(conn.sock.fileno())
            stale = key.data if key is not None else None
            logger.warning("fiber's stream listener: a connection's descriptor (%d) was "
                           "closed by something else in this process: dropped it",
                           conn.sock.fileno())
            try:
                self._selector.unregister(conn.sock.fileno())
            except (KeyError, ValueError, OSError):
                pass
            if isinstance(stale, _Connection) and stale is not conn:
                with self._lock:
                    self._parked.pop(stale, None)
                self._conns.discard(stale)
                try:
                    stale.sock.detach()  # (never closed: the number is conn's now)
                except OSError:
                    pass
                stale.close()
                self._peer_lost(stale.peer)
        except (ValueError, OSError):
            pass
        try:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        except (KeyError, ValueError, OSError):
            self._drop(conn)

    def _watch(self, conn: _Connection, write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        with self._lock:
            if conn in self._parked:
                # out of the selector since a direct read: what is left to write brings
                # it back now (unless a caller reads it directly: that caller writes it)
                if write and conn.rlock.acquire(False):
                    try:
                        self._selector.register(conn.sock, events, conn)
                    except (KeyError, ValueError, OSError):
                        pass
                    finally:
                        del self._parked[conn]  # (with the token held, as in _unpark)
                        conn.rlock.release()
                return
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

    def _read_and_dispatch(self, conn: _Connection, direct: Direct | None = None) -> bool:
        """Dispatch the frames that are complete now (holding conn.rlock, so that they
        are dispatched in the order they came); False when the connection ended.
        ``direct`` (a direct reader's) is offered each frame first."""
        try:
            frames = conn.read()
        except OSError:
            self._drop(conn)
            return False
        dispatch = self._dispatch
        for line, body in frames:
            request = StreamRequest(conn, line)
            if direct is None or not direct(request, body):
                dispatch(request, body, True)
        return True

    def read_directly(self, conn: _Connection, done: Callable[[], bool],
                      timeout: float | None, direct: Direct | None = None) -> bool:
        """Let the calling thread, which waits for a reply to come on ``conn``, read
        that connection itself until ``done()`` holds or ``timeout`` passes: the reply
        is then dispatched on the thread that waits for it, and the hop from the
        selector thread (a thread wake-up, about a fifth of a pool's round trip) is
        saved. ``direct(request, body)``, if given, is offered each frame read first
        (True: it handled the frame, which then does not pass the hub's dispatch: the
        pool's reply path, :meth:`fiber.runtime.pool.channel.PoolChannel.direct`).
        The connection leaves the selector meanwhile and returns to it when no
        caller has read it for ``_PARK`` seconds (at once when it has bytes to write).
        False when another thread is reading the connection or it is gone (the
        caller then waits as usual)."""
        if conn.closed or not conn.rlock.acquire(False):
            return False
        # parked (left out by the last direct read): it stays out while this thread
        # holds its reader token (the selector thread takes it back only with the
        # token), so no listener lock is needed to use it
        parked = conn in self._parked
        if not parked:
            with self._lock:
                try:
                    self._selector.unregister(conn.sock)
                except (KeyError, ValueError, OSError):
                    conn.rlock.release()  # closed meanwhile
                    return False
        deadline = None if timeout is None else time.monotonic() + timeout
        # one poll object per connection, made by its first direct read and used by
        # the holder of the reader token only
        poller = conn.poller
        if poller is None:
            poller = conn.poller = select.poll()
            poller.register(conn.sock, _POLLIN)
            conn.poll_mask = _POLLIN
        alive = True
        try:
            while not done():
                # done() is checked again at least every _RECHECK seconds: what it waits
                # for may happen elsewhere (its task moved to another connection)
                wait = _RECHECK_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, math.ceil(left * 1000))
                # what this thread's replies could not write at once is written here
                # too: the selector does not watch the connection meanwhile
                want = (_POLLIN | _POLLOUT) if conn._out else _POLLIN
                if want != conn.poll_mask:
                    conn.poll_mask = want
                    poller.modify(conn.sock, want)
                events = poller.poll(wait)
                if not events:
                    continue
                if events[0][1] & select.POLLOUT:
                    conn.flush()
                if events[0][1] & ~select.POLLOUT and \
                        not self._read_and_dispatch(conn, direct):
                    alive = False
                    break
        finally:
            if parked and alive and not conn._out and not conn.closed and not self._closed:
                # parked before and stays so: only its time changes, without the lock
                # (the selector thread reads the list under the lock, but takes a
                # connection off it only with its reader token, held here until now)
                self._parked[conn] = time.monotonic()
                conn.rlock.release()
            else:
                self._after_direct_read(conn, alive)
        return True

    def _after_direct_read(self, conn: _Connection, alive: bool) -> None:
        """Where a connection read directly goes when the read ends (its reader token
        held): dropped, back in the selector (bytes to write), or parked; then the
        token is given back."""
        wake = False
        with self._lock:
            if not alive or conn.closed or self._closed:
                self._parked.pop(conn, None)
            elif conn._out:
                self._parked.pop(conn, None)
                try:
                    self._selector.register(
                        conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
                except (KeyError, ValueError, OSError):
                    pass
            else:
                # left out of the selector for the next direct read; the selector
                # thread (woken when it had none) takes it back after _PARK
                wake = not self._parked
                self._parked[conn] = time.monotonic()
            # given back once it is where it stays (the next direct reader reads
            # whether it is parked without the lock)
            conn.rlock.release()
        if wake:
            self._wake()

    def _drop(self, conn: _Connection) -> None:
        with self._lock:
            self._parked.pop(conn, None)
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError, OSError):
                pass
        self._conns.discard(conn)
        conn.close()
        self._peer_lost(conn.peer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.gate.close()
        self._wake()
        for conn in list(self._conns):
            conn.close()
        for sock in (self._sock, self._local):
            try:
                if sock is not None:
                    sock.close()
            except OSError:
                pass


class StreamAdmission(FramedAdmission):
    """The hub's half of the handshake over stream frames, driven by the gate: frames
    longer than :data:`~fiber.wire.stream.framing.HANDSHAKE_MAX` are refused unread."""

    def __init__(self, handshake: HubHandshake) -> None:
        super().__init__(_FRAME, HANDSHAKE_MAX)
        self.handshake = handshake

    def _verdict(self, reply: bytes) -> bytes:
        self.accepted = self.handshake.accepted
        self.refused = self.handshake.refused
        return reply

    def message(self, fields: tuple, body: bytes) -> bytes:
        return self._verdict(frame(fields[1], self.handshake.step(body)))

    def refuse(self, reason: str) -> bytes:
        return self._verdict(frame(0, self.handshake.refuse(reason)))

    def expired(self, seconds: float) -> bytes:
        expired = self.handshake.expired(seconds)
        return self._verdict(frame(0, AUTH_REFUSED) if expired else b"")

    def dropped(self, cause: object) -> None:
        self.handshake.dropped(cause)


def _peer_name(sock: socket.socket) -> str:
    """Who is at the other end of an accepted connection, for the log."""
    if sock.family == socket.AF_UNIX:
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                    struct.calcsize("3i"))
        except (OSError, AttributeError):  # not Linux
            return "a process on this host"
        pid, uid, _ = struct.unpack("3i", creds)
        return f"a process on this host (pid {pid}, uid {uid})"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return "a peer that left"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

