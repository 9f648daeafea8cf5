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

**A descriptor closed behind its back.** Code of the program may close a descriptor
*number* it does not own (``os.close(n)``, a connection object rebuilt around a number
that means something else here): the kernel then gives that number to the next socket
opened, while the gate's selector still has an entry for it. The gate checks the
identity (device, inode) of its listening sockets and its wake-up pipe every
:data:`VERIFY_EVERY` seconds, whenever a new connection's number is found already in
its selector, and when its owner asks (:meth:`Gate.check`, before a job is started): a
stale entry is dropped without closing the number (it is someone else's now), a lost
listening socket is replaced by a new one on the same address (the owner is told,
``renewed``) with one warning that says what happened, and when no socket can listen
there again, the gate fails with :class:`~fiber.errors.ListenerLostError` naming the
listener (its owner's ``on_death``: what depends on it fails at once). A selector
whose own descriptor was closed is replaced the same way.

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
import stat
import struct
import threading
import time
from collections.abc import Callable

from fiber import threads
from fiber.errors import AuthenticationError, ListenerLostError

__all__ = ["DEADLINE", "MAX_PENDING", "VERIFY_EVERY", "Admission", "FramedAdmission", "Gate",
           "RateLimitedLog", "admit_blocking"]

logger = logging.getLogger("fiber")

DEADLINE = 10.0  # seconds from accept to a completed handshake
MAX_PENDING = 256  # connections in their handshake at once, per gate
BACKLOG = 512  # the listening sockets' queue of connections not yet accepted
_ACCEPTS_PER_WAKE = 64  # then pending handshakes get their turn
_PAUSE = 0.1  # seconds a listener rests after an accept failed for want of resources
VERIFY_EVERY = 1.0  # seconds between checks that the listening sockets are still ours
_CHECK_WAIT = 2.0  # seconds Gate.check waits for the gate to listen again
# selectors whose descriptor was closed behind their back: never closed nor collected
# (closing one would close the number, which belongs to someone else now)
_abandoned: list[object] = []


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


class _Listening:
    """A listening socket of the gate and what identifies its descriptor."""

    __slots__ = ("sock", "make", "fd", "identity", "family", "address", "renewed")

    def __init__(self, sock: socket.socket, make: Callable[[socket.socket], Admission],
                 renewed: Callable[[socket.socket, socket.socket], None] | None) -> None:
        self.sock = sock
        self.make = make
        self.fd = sock.fileno()
        self.identity = _identity(self.fd)
        self.family = sock.family
        self.address = sock.getsockname()
        self.renewed = renewed


def _identity(fd: int) -> tuple[int, int] | None:
    """What the descriptor ``fd`` is (device, inode), or None when it is closed."""
    if fd < 0:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _describe(address: object) -> str:
    if isinstance(address, bytes) and address[:1] == b"\0":
        return "@" + address[1:].decode("utf-8", "replace")
    if isinstance(address, tuple):
        host, port = address[:2]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


_LISTENING = object()
_WAKE = object()


class Gate:
    """Admits connections of listening sockets (:meth:`listen`) through their
    handshakes, then hands each to ``admitted(sock, admission)`` (the socket is
    non-blocking; the callback owns it from then on, and must not block)."""

    def __init__(self, name: str, admitted: Callable[[socket.socket, Admission], None],
                 *, deadline: float = DEADLINE, max_pending: int = MAX_PENDING,
                 on_death: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self._admitted = admitted
        self.deadline = deadline
        self.max_pending = max_pending
        self.log = RateLimitedLog()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = -1, -1
        self._wake_identity: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None)
        self._new_wake_pipe()
        self._listening: dict[socket.socket, _Listening] = {}
        self._paused: dict[socket.socket, float] = {}
        self._pending: collections.OrderedDict[socket.socket, _Pending] = (
            collections.OrderedDict())
        self._lock = threading.Lock()
        self._added: list[_Listening] = []
        self._checks: list[threading.Event] = []  # Gate.check()s waiting for a verify
        self._next_verify = time.monotonic() + VERIFY_EVERY
        self._errors_said: set[str] = set()  # unexpected errors logged with a traceback
        self._closed = False
        self.evicted = 0  # connections closed to make room (for tests and the log)
        self.renewals = 0  # listening sockets made again (for tests and the log)
        # why the gate stopped admitting: its thread died (FiberThreadError), or a
        # listening socket was lost for good (ListenerLostError)
        self.failure: BaseException | None = None
        self._on_death = on_death
        # its loop survives every error; should the thread die anyway (fiber.threads),
        # the owner is told (on_death) and closes its listener: connecting peers are
        # then refused at once instead of waiting for a handshake nobody drives
        self._thread = threads.start("fiber-gate", self._run, name=f"fiber-gate-{name}",
                                     fails=self._died)

    def _died(self, error: BaseException) -> None:
        with self._lock:
            if self.failure is not None:
                return  # (told once)
            self.failure = error
        if self._on_death is not None:
            self._on_death(error)

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._pending)

    def listen(self, sock: socket.socket, make: Callable[[socket.socket], Admission],
               renewed: Callable[[socket.socket, socket.socket], None] | None = None) -> None:
        """Admit the connections of the listening socket ``sock``, each through the
        admission ``make(sock)`` returns for it. Should ``sock``'s descriptor be closed
        behind its back, the gate listens on its address with a new socket and calls
        ``renewed(old, new)`` (on its thread; ``old`` is detached, ``new`` is the
        owner's to close from then on). Raises the gate's failure
        (:class:`~fiber.errors.FiberThreadError` when its thread has died)."""
        with self._lock:
            if self.failure is not None:  # (its owner closes the socket)
                raise self.failure
            sock.setblocking(False)
            # the kernel's queue of connections not yet accepted only buffers them for
            # the gate (which takes each at once): a small backlog (multiprocessing's
            # Listener defaults to 1) would drop connections while the gate's thread
            # waits for the GIL
            sock.listen(BACKLOG)
            self._added.append(_Listening(sock, make, renewed))
        self._wake()

    def check(self, wait: float = _CHECK_WAIT) -> None:
        """Raise the gate's failure, if it has one. When a listening socket's
        descriptor was closed behind its back, the gate's thread listens again first
        (this waits for it, at most ``wait`` seconds): called before something that
        depends on the listener starts (a job that will connect to it)."""
        failure = self.failure
        if failure is not None:
            raise failure
        if any(_identity(entry.fd) != entry.identity
               for entry in list(self._listening.values())):
            done = threading.Event()
            with self._lock:
                self._checks.append(done)
            self._wake()
            done.wait(wait)
            failure = self.failure
            if failure is not None:
                raise failure

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
            except Exception as exc:  # noqa: BLE001 - the gate must outlive anything
                said = f"{type(exc).__name__}: {exc}"
                if said not in self._errors_said and len(self._errors_said) < 64:
                    self._errors_said.add(said)  # its traceback once, then counted
                    logger.exception("fiber's %s gate: an unexpected error (going on)",
                                     self.name)
                else:
                    self.log.warning("fiber's %s gate: an unexpected error again (%s): "
                                     "going on", self.name, said)
                time.sleep(_PAUSE)
                try:
                    self._verify()  # what a closed descriptor broke is mended here
                except Exception:  # noqa: BLE001
                    logger.debug("fiber's %s gate: verifying failed", self.name,
                                  exc_info=True)
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
        if self._listening or self._added:
            rest = max(0.0, self._next_verify - now)
            timeout = rest if timeout is None else min(timeout, rest)
        try:
            events = self._selector.select(timeout)
        except OSError as exc:
            if self._closed:
                return
            self._renew_selector(exc)
            return
        for key, _ in events:
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
        if now >= self._next_verify or self._checks:
            self._verify()

    # -- descriptors closed behind the gate's back ---------------------------------------
    def _verify(self) -> None:
        """Check that the listening sockets and the wake-up pipe are still the
        descriptors they were; mend what is not. Then answer waiting checks."""
        self._next_verify = time.monotonic() + VERIFY_EVERY
        if (_identity(self._wake_r), _identity(self._wake_w)) != self._wake_identity:
            self._drop_entry(self._wake_r, _WAKE)
            logger.warning("fiber's %s gate: its wake-up pipe was closed by something else "
                           "in this process: made a new one", self.name)
            self._new_wake_pipe()
        for entry in list(self._listening.values()):
            if entry.sock.fileno() < 0:
                self._forget(entry.sock)  # closed by its owner
            elif _identity(entry.fd) != entry.identity:
                self._lost(entry, "closed by something else in this process")
        with self._lock:
            checks, self._checks = self._checks, []
        for done in checks:
            done.set()

    def _new_wake_pipe(self) -> None:
        # (a lost pipe's descriptors are left alone: their numbers may be others' now)
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._selector.register(read, selectors.EVENT_READ, _WAKE)
        self._wake_r, self._wake_w = read, write
        self._wake_identity = (_identity(read), _identity(write))

    def _drop_entry(self, fd: int, data: object) -> None:
        """Take the selector's entry for descriptor number ``fd`` out if it is the one
        of ``data`` (a socket object, or the wake marker), closing nothing."""
        key = self._selector.get_map().get(fd)
        if key is None or (key.data is not data and key.fileobj is not data):
            return
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def _stale(self, fd: int) -> None:
        """A new socket got the number ``fd``, which the selector still has: the
        descriptor of that entry was closed behind the gate's back. Drop the entry."""
        key = self._selector.get_map().get(fd)
        if key is None:
            return
        data = key.data
        if data is _LISTENING:
            entry = self._listening.get(key.fileobj)  # type: ignore[call-overload]
            if entry is not None:
                self._lost(entry, "closed by something else in this process (its number "
                                  "was given to a new connection)")
                return
        elif data is _WAKE:
            self._drop_entry(fd, _WAKE)
            logger.warning("fiber's %s gate: its wake-up pipe was closed by something else "
                           "in this process: made a new one", self.name)
            self._new_wake_pipe()
            return
        elif isinstance(data, _Pending):
            self._pending.pop(data.sock, None)
            data.admission.dropped("its descriptor was closed by something else")
            _detach(data.sock)
        try:
            self._selector.unregister(fd)
        except (KeyError, ValueError, OSError):
            pass

    def _lost(self, entry: _Listening, why: str) -> None:
        """The listening socket of ``entry`` lost its descriptor: listen again on its
        address with a new socket, or fail (the owner's ``on_death``)."""
        old = entry.sock
        self._listening.pop(old, None)
        self._paused.pop(old, None)
        self._drop_entry(entry.fd, old)
        _detach(old)  # its number may be someone else's now: never closed by us
        where = _describe(entry.address)
        try:
            new = _listen_again(entry)
        except OSError as exc:
            error = ListenerLostError(
                f"fiber's {self.name} listener lost its listening socket on {where} "
                f"(descriptor {entry.fd}, {why}) and cannot listen there again: {exc}. "
                "Something in this program closed a descriptor it did not own (a "
                "connection or socket rebuilt from a bare descriptor number?)")
            logger.error("%s", error)
            self._died(error)
            return
        self.renewals += 1
        logger.warning("fiber's %s listener's socket on %s (descriptor %d) was %s: it "
                       "listens there again (descriptor %d). Something in this program "
                       "closed a descriptor it did not own", self.name, where, entry.fd,
                       why, new.fileno())
        renewed = _Listening(new, entry.make, entry.renewed)
        self._listening[new] = renewed
        self._register_listening(new)
        if entry.renewed is not None:
            try:
                entry.renewed(old, new)
            except Exception:  # noqa: BLE001 - the gate goes on
                logger.exception("fiber's %s listener: taking its new socket failed",
                                 self.name)

    def _renew_selector(self, cause: OSError) -> None:
        """select() failed: the selector's own descriptor was closed behind the gate's
        back. Make a new one and register everything again."""
        old = self._selector
        _abandoned.append(old)  # (closing it would close a number that is not ours)
        self._selector = selectors.DefaultSelector()
        logger.warning("fiber's %s gate: its selector failed (%s), closed by something "
                       "else in this process: made a new one", self.name, cause)
        self._new_wake_pipe()  # (the old one may be fine: it is simply left)
        for sock in list(self._listening):
            if sock not in self._paused:
                self._register_listening(sock)
        for sock, pending in list(self._pending.items()):
            try:
                self._selector.register(sock, selectors.EVENT_READ, pending)
            except (KeyError, ValueError, OSError):
                self._pending.pop(sock, None)
                _detach(sock)
        self._verify()

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except OSError:
            pass
        with self._lock:
            added, self._added = self._added, []
        for entry in added:
            self._listening[entry.sock] = entry
            self._register_listening(entry.sock)

    def _register_listening(self, sock: socket.socket) -> None:
        try:
            self._selector.register(sock, selectors.EVENT_READ, _LISTENING)
        except KeyError:
            self._stale(sock.fileno())  # an entry whose descriptor was closed: dropped
            try:
                self._selector.register(sock, selectors.EVENT_READ, _LISTENING)
            except (KeyError, ValueError, OSError):
                self._listening.pop(sock, None)
        except (ValueError, OSError):
            self._listening.pop(sock, None)  # closed by its owner

    def _accept(self, listening: socket.socket) -> None:
        entry = self._listening.get(listening)
        if entry is None:
            return
        make = entry.make
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if listening.fileno() < 0:
                    self._forget(listening)  # its owner closed it
                    return
                if exc.errno in (errno.EBADF, errno.ENOTSOCK, errno.EINVAL):
                    self._lost(entry, f"closed by something else in this process ({exc})")
                    return
                self.log.warning("fiber's %s listener could not accept a connection (%s): "
                                 "going on", self.name, exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._pending:
                    self._evict(reason="to free a file descriptor")
                else:
                    self._pause(listening)
                return
            try:
                self._admit_new(sock, make)
            except Exception as exc:  # noqa: BLE001 - one connection, not the gate
                self.log.warning("fiber's %s listener could not take a new connection "
                                 "(%s: %s): closed it", self.name, type(exc).__name__, exc)
                self._pending.pop(sock, None)
                _close(sock)

    def _forget(self, listening: socket.socket) -> None:
        entry = self._listening.pop(listening, None)
        self._paused.pop(listening, None)
        if entry is not None:
            # by its number: a closed socket object has none any more
            self._drop_entry(entry.fd, listening)

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
        except KeyError:
            # the selector has an entry for this number: its descriptor was closed
            # behind the gate's back (the kernel reuses the lowest free number)
            self._stale(sock.fileno())
            try:
                self._selector.register(sock, selectors.EVENT_READ, pending)
            except (KeyError, ValueError, OSError) as exc:
                self.log.warning("fiber's %s listener could not watch a new connection "
                                 "(%s): closed it", self.name, exc)
                _close(sock)
                return
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
            if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                # closed behind the gate's back: the number may be someone else's
                self._pending.pop(sock, None)
                self._drop_entry(sock.fileno(), pending)
                _detach(sock)
                return
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


def _detach(sock: socket.socket) -> None:
    """Forget ``sock``'s descriptor without closing it (it was closed behind our back,
    and its number may belong to another object now)."""
    try:
        sock.detach()
    except OSError:
        pass


def _listen_again(entry: _Listening) -> socket.socket:
    """A new listening socket on the address of ``entry`` (non-blocking)."""
    new = socket.socket(entry.family, socket.SOCK_STREAM)
    try:
        address = entry.address
        if entry.family in (socket.AF_INET, socket.AF_INET6):
            new.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        elif isinstance(address, str) and address:
            # a Unix socket's file outlives its socket: take its place if it is one
            try:
                if stat.S_ISSOCK(os.lstat(address).st_mode):
                    os.unlink(address)
            except OSError:
                pass
        new.bind(address)
        new.listen(BACKLOG)
        new.setblocking(False)
    except BaseException:
        new.close()
        raise
    return new


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
