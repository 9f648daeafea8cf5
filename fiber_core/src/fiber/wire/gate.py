"""The door of every socket fiber listens on: what a stranger may cost before it has
proved the run's secret.

Anyone who can reach a port can connect to it (a port scanner, another user of a login
node). Until a connection has completed its listener's handshake, a :class:`Gate`
holds it to:

- **bounded memory**: its :class:`Admission` reads exactly the bytes of its next
  handshake message, and a message announced longer than a handshake may be refuses the
  connection before a byte of its body is read;
- **no thread of its own**: one thread per gate drives every pending handshake from a
  selector (a handshake is two short messages and an HMAC);
- **a deadline**: :data:`DEADLINE` seconds from its accept, whatever it sends meanwhile
  (one byte a second included);
- **a cap**: at most :data:`MAX_PENDING` connections wait at once; the oldest is closed
  to make room for a new one.

Then it is handed to its listener (``admitted``) and trusted. The gate's thread
survives every error (a failed accept for want of descriptors, a listener's callback
that raises): each is logged, rate-limited, and the gate goes on.

:func:`admit_blocking` drives one admission on the calling thread with the same
bounds, for listeners whose ``accept()`` runs the handshake itself
(:class:`fiber.connection.Listener`, as multiprocessing's does).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import select
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

from fiber import threads
from fiber.errors import AuthenticationError, FiberThreadError

__all__ = ["DEADLINE", "MAX_PENDING", "Admission", "FramedAdmission", "Gate",
           "RateLimitedLog", "admit_blocking"]

logger = logging.getLogger("fiber")

DEADLINE = 10.0  # seconds from accept to a completed handshake
MAX_PENDING = 256  # connections in their handshake at once, per gate
BACKLOG = 512  # the listening sockets' queue of connections not yet accepted
_ACCEPTS_PER_WAKE = 64  # then pending handshakes get their turn
_PAUSE = 0.1  # seconds a listener rests after an accept failed for want of resources


class RateLimitedLog:
    """At most ``burst`` warnings per ``period`` seconds; what is held back is counted
    and said with the next warning that gets through."""

    def __init__(self, burst: int = 20, period: float = 10.0) -> None:
        self._burst = burst
        self._period = period
        self._lock = threading.Lock()
        self._window = 0.0
        self._said = 0
        self._held = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._window >= self._period:
                self._window, self._said = now, 0
            if self._said >= self._burst:
                self._held += 1
                return
            self._said += 1
            held, self._held = self._held, 0
        if held:
            message += " (and %d similar warnings held back)"
            args = (*args, held)
        logger.warning(message, *args)


class Admission:
    """One connection's handshake as a gate drives it. The gate reads at most
    :meth:`want` bytes at a time, gives them to :meth:`received` and sends what that
    returns, until :attr:`accepted` or :attr:`refused` is set."""

    accepted: bool = False
    refused: str | None = None

    def opening(self) -> bytes:
        """What the listening side says first (nothing, unless its protocol starts)."""
        return b""

    def want(self) -> int:
        """How many bytes may be read now (never more than the handshake needs)."""
        raise NotImplementedError

    def received(self, data: bytes) -> bytes:
        """Take ``data`` (at most :meth:`want` bytes); the bytes to send back."""
        raise NotImplementedError

    def expired(self, seconds: float) -> bytes:
        """The deadline passed; what to send before closing (logged by the subclass)."""
        self.refused = "too slow"
        return b""

    def dropped(self, cause: object) -> None:
        """The peer went away during the handshake."""


class FramedAdmission(Admission):
    """An admission over length-prefixed messages: a ``header`` (a struct whose first
    field is the body's length), then the body, at most ``limit`` bytes. Subclasses
    answer each message (:meth:`message`) and say how to refuse (:meth:`refuse`)."""

    def __init__(self, header: struct.Struct, limit: int) -> None:
        self._header = header
        self._limit = limit
        self._buf = bytearray()
        self._fields: tuple | None = None  # the header, once read; then the body

    def want(self) -> int:
        if self._fields is None:
            return self._header.size - len(self._buf)
        return self._fields[0] - len(self._buf)

    def received(self, data: bytes) -> bytes:
        self._buf += data
        if self._fields is None:
            if len(self._buf) < self._header.size:
                return b""
            fields = self._header.unpack(bytes(self._buf))
            self._buf.clear()
            if not 0 <= fields[0] <= self._limit:
                return self.refuse(f"a message of {fields[0]} bytes, more than a handshake "
                                   f"may send ({self._limit})")
            self._fields = fields
            if fields[0] > 0:
                return b""
        elif len(self._buf) < self._fields[0]:
            return b""
        fields, body = self._fields, bytes(self._buf)
        self._fields = None
        self._buf.clear()
        return self.message(fields, body)

    def message(self, fields: tuple, body: bytes) -> bytes:
        """The reply to one complete message (``fields``: its header)."""
        raise NotImplementedError

    def refuse(self, reason: str) -> bytes:
        """Refuse the connection for ``reason``; the bytes to send before closing."""
        raise NotImplementedError


class _Pending:
    __slots__ = ("sock", "admission", "deadline")

    def __init__(self, sock: socket.socket, admission: Admission, deadline: float) -> None:
        self.sock = sock
        self.admission = admission
        self.deadline = deadline


_LISTENING = object()
_WAKE = object()


class Gate:
    """Admits connections of listening sockets (:meth:`listen`) through their
    handshakes, then hands each to ``admitted(sock, admission)`` (the socket is
    non-blocking; the callback owns it from then on, and must not block)."""

    def __init__(self, name: str, admitted: Callable[[socket.socket, Admission], None],
                 *, deadline: float = DEADLINE, max_pending: int = MAX_PENDING,
                 on_death: Callable[[FiberThreadError], None] | None = None) -> None:
        self.name = name
        self._admitted = admitted
        self.deadline = deadline
        self.max_pending = max_pending
        self.log = RateLimitedLog()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._listening: dict[socket.socket, Callable[[socket.socket], Admission]] = {}
        self._paused: dict[socket.socket, float] = {}
        self._pending: collections.OrderedDict[socket.socket, _Pending] = (
            collections.OrderedDict())
        self._lock = threading.Lock()
        self._added: list[tuple[socket.socket, Callable[[socket.socket], Admission]]] = []
        self._closed = False
        self.evicted = 0  # connections closed to make room (for tests and the log)
        self.failure: FiberThreadError | None = None  # why the gate's thread died
        self._on_death = on_death
        # its loop survives every error; should the thread die anyway (fiber.threads),
        # the owner is told (on_death) and closes its listener: connecting peers are
        # then refused at once instead of waiting for a handshake nobody drives
        self._thread = threads.start("fiber-gate", self._run, name=f"fiber-gate-{name}",
                                     fails=self._died)

    def _died(self, error: FiberThreadError) -> None:
        with self._lock:
            self.failure = error
        if self._on_death is not None:
            self._on_death(error)

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._pending)

    def listen(self, sock: socket.socket,
               make: Callable[[socket.socket], Admission]) -> None:
        """Admit the connections of the listening socket ``sock``, each through the
        admission ``make(sock)`` returns for it. Raises the gate's
        :class:`~fiber.errors.FiberThreadError` when its thread has died."""
        with self._lock:
            if self.failure is not None:  # its thread died (its owner closes the socket)
                raise self.failure
            sock.setblocking(False)
            # the kernel's queue of connections not yet accepted only buffers them for
            # the gate (which takes each at once): a small backlog (multiprocessing's
            # Listener defaults to 1) would drop connections while the gate's thread
            # waits for the GIL
            sock.listen(BACKLOG)
            self._added.append((sock, make))
        self._wake()

    def close(self) -> None:
        """Stop: pending connections are closed (the listening sockets are the
        caller's)."""
        with self._lock:
            self._closed = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # a wake-up is pending already

    # -- the gate's thread ----------------------------------------------------------
    def _run(self) -> None:
        while not self._closed:
            try:
                self._once()
            except Exception:  # noqa: BLE001 - the gate must outlive anything
                logger.exception("fiber's %s gate: an unexpected error (going on)", self.name)
                time.sleep(_PAUSE)
        for pending in list(self._pending.values()):
            _close(pending.sock)
        self._pending.clear()
        self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _once(self) -> None:
        now = time.monotonic()
        timeout: float | None = None
        if self._pending:
            timeout = max(0.0, next(iter(self._pending.values())).deadline - now)
        if self._paused:
            rest = max(0.0, min(self._paused.values()) - now)
            timeout = rest if timeout is None else min(timeout, rest)
        for key, _ in self._selector.select(timeout):
            data = key.data
            if data is _WAKE:
                self._drain_wake()
            elif data is _LISTENING:
                self._accept(key.fileobj)  # type: ignore[arg-type]
            else:
                self._step(data)
        now = time.monotonic()
        self._expire(now)
        for sock, until in list(self._paused.items()):
            if until <= now:
                del self._paused[sock]
                self._register_listening(sock)

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass
        with self._lock:
            added, self._added = self._added, []
        for sock, make in added:
            self._listening[sock] = make
            self._register_listening(sock)

    def _register_listening(self, sock: socket.socket) -> None:
        try:
            self._selector.register(sock, selectors.EVENT_READ, _LISTENING)
        except (KeyError, ValueError, OSError):
            self._listening.pop(sock, None)  # closed by its owner

    def _accept(self, listening: socket.socket) -> None:
        make = self._listening.get(listening)
        if make is None:
            return
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno == errno.EBADF or listening.fileno() < 0:
                    self._forget(listening)  # its owner closed it
                    return
                self.log.warning("fiber's %s listener could not accept a connection (%s): "
                                 "going on", self.name, exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._pending:
                    self._evict(reason="to free a file descriptor")
                else:
                    self._pause(listening)
                return
            self._admit_new(sock, make)

    def _forget(self, listening: socket.socket) -> None:
        self._listening.pop(listening, None)
        self._paused.pop(listening, None)
        try:
            self._selector.unregister(listening)
        except (KeyError, ValueError, OSError):
            pass

    def _pause(self, listening: socket.socket) -> None:
        try:
            self._selector.unregister(listening)
        except (KeyError, ValueError, OSError):
            return
        self._paused[listening] = time.monotonic() + _PAUSE

    def _admit_new(self, sock: socket.socket, make: Callable[[socket.socket], Admission]) -> None:
        try:
            sock.setblocking(False)
            admission = make(sock)
            opening = admission.opening()
            if opening and sock.send(opening) != len(opening):
                raise ConnectionError("could not send the handshake's first message")
        except Exception as exc:  # noqa: BLE001 - one bad connection, not the gate
            logger.debug("fiber's %s gate: a new connection failed (%s)", self.name, exc)
            _close(sock)
            return
        if len(self._pending) >= self.max_pending:
            self._evict(reason=f"more than {self.max_pending} connections were "
                               "authenticating at once")
        pending = _Pending(sock, admission, time.monotonic() + self.deadline)
        try:
            self._selector.register(sock, selectors.EVENT_READ, pending)
        except (ValueError, OSError):
            _close(sock)
            return
        self._pending[sock] = pending

    def _evict(self, reason: str) -> None:
        sock, pending = self._pending.popitem(last=False)
        self.evicted += 1
        self.log.warning("fiber's %s listener closed the connection that had waited longest "
                         "in its handshake: %s", self.name, reason)
        pending.admission.dropped("evicted")
        self._discard(sock)

    def _discard(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError, OSError):
            pass
        _close(sock)

    def _expire(self, now: float) -> None:
        while self._pending:
            pending = next(iter(self._pending.values()))
            if pending.deadline > now:
                return
            try:
                goodbye = pending.admission.expired(self.deadline)
                if goodbye:
                    pending.sock.send(goodbye)
            except Exception:  # noqa: BLE001 - it is closed either way
                pass
            self._discard(pending.sock)

    def _step(self, pending: _Pending) -> None:
        sock, admission = pending.sock, pending.admission
        try:
            data = sock.recv(max(1, admission.want()))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            admission.dropped(exc)
            self._discard(sock)
            return
        if not data:
            admission.dropped("closed")
            self._discard(sock)
            return
        try:
            reply = admission.received(data)
            if reply and sock.send(reply) != len(reply):
                raise ConnectionError("the peer does not read its replies")
        except Exception as exc:  # noqa: BLE001 - a handshake gone wrong ends it
            admission.dropped(exc)
            self._discard(sock)
            return
        if admission.refused is not None:
            self._discard(sock)
        elif admission.accepted:
            self._pending.pop(sock, None)
            try:
                self._selector.unregister(sock)
            except (KeyError, ValueError, OSError):
                pass
            try:
                self._admitted(sock, admission)
            except Exception as exc:  # noqa: BLE001 - the gate outlives its listener's errors
                self.log.warning("fiber's %s listener could not take an authenticated "
                                 "connection (%s: %s): closed it", self.name,
                                 type(exc).__name__, exc)
                _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


def admit_blocking(sock: socket.socket, admission: Admission, deadline: float = DEADLINE) -> None:
    """Drive ``admission`` on ``sock`` on the calling thread until it is accepted;
    raises :class:`~fiber.errors.AuthenticationError` when it is refused or does not
    finish within ``deadline`` seconds (the socket is left open: the caller closes it).
    The socket is blocking again on return."""
    end = time.monotonic() + deadline
    sock.setblocking(False)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    try:
        opening = admission.opening()
        if opening:
            _send_all_by(sock, opening, end)
        while not admission.accepted:
            if admission.refused is not None:
                raise AuthenticationError(f"the peer was refused: {admission.refused}")
            left = end - time.monotonic()
            if left <= 0:
                goodbye = admission.expired(deadline)
                if goodbye:
                    try:
                        sock.send(goodbye)
                    except OSError:
                        pass
                raise AuthenticationError(
                    f"the peer did not complete the handshake within {deadline:g}s")
            if not poller.poll(max(1, int(left * 1000))):
                continue
            try:
                data = sock.recv(max(1, admission.want()))
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                admission.dropped("closed")
                raise AuthenticationError("the peer closed the connection during the handshake")
            reply = admission.received(data)
            if reply:
                _send_all_by(sock, reply, end)
    finally:
        sock.setblocking(True)


def _send_all_by(sock: socket.socket, data: bytes, end: float) -> None:
    view = memoryview(data)
    while view:
        if time.monotonic() > end:
            raise AuthenticationError("the peer does not read the handshake")
        try:
            view = view[sock.send(view):]
        except (BlockingIOError, InterruptedError):
            select.select([], [sock], [], max(0.0, end - time.monotonic()))
