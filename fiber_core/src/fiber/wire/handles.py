"""Handles that travel as handles: connections, sockets and file descriptors sent to
another fiber process are duplicated into it, never pickled as a bare number.

A descriptor number means something only in the process that has it. multiprocessing
passes a connection, a socket or a ``DupFd`` to another process by duplicating the
descriptor into it over a Unix domain socket (``SCM_RIGHTS``); fiber does the same
between two processes that share a kernel and a network namespace, and refuses
everywhere else with :class:`~fiber.errors.HandleError`, which says why.

**The sender** (pickling). The descriptor is duplicated at once (so the sender may
close its object right after sending, as with multiprocessing) and kept by this
process's *handle sharer* under a random key; the pickle carries a :class:`Ref`: the
sharer's address (an abstract Unix socket), the key, and the identity of the sender's
kernel and network namespace. A duplicate is handed over once (the first process that
unpickles it takes it), and is kept until then or until this process exits, as
multiprocessing's resource sharer keeps it.

**The receiver** (unpickling). It compares the identity with its own
(:func:`kernel_identity`): the boot id of the kernel (``/proc/sys/kernel/random/boot_id``,
new at every boot, the same in every container of the machine) and the inode of the
network namespace (``/proc/self/ns/net``: an abstract Unix socket is reachable only
from the namespace where it was bound). Same kernel and namespace: it connects to the
sharer, proves the run's secret (fiber's mutual handshake in length-prefixed frames),
names the key and receives the duplicate with ``SCM_RIGHTS``: a new descriptor of its
own, whatever its number. Otherwise (another host, a container or pod with a network
of its own, a backend whose jobs do not share the kernel) unpickling raises
:class:`~fiber.errors.HandleError`. The pid namespace does not matter: ``SCM_RIGHTS``
needs no pid.

**The sharer** is a listener: it listens on an abstract Unix socket, reachable by any
process of the network namespace, so it admits through a :class:`~fiber.wire.gate.Gate`
(no thread per stranger, bounded memory, the handshake deadline) and hands a
descriptor only to a peer that proved the secret and named a key it holds. It starts
on the first handle shared, in its own gate thread; a fork's child forgets the parent's
sharer (and closes its copies of the duplicates).

What pickles how: :class:`multiprocessing.connection.Connection` through
:mod:`copyreg` (fiber's wire pickles with the standard pickle; a plain ``pickle.dumps``
of such a connection in a fiber process shares it too, instead of writing its number);
:class:`socket.socket` through fiber's cloudpickle fallback only (``pickle.dumps`` of a
socket still raises, as it does without fiber); :class:`SharedFd` (what
``fiber.reduction.DupFd`` returns) by itself.
"""

from __future__ import annotations

import copyreg
import errno
import logging
import os
import socket
import struct
import threading
from multiprocessing import connection as _mp_connection
from typing import Any, NamedTuple

from fiber.errors import AuthenticationError, HandleError

__all__ = ["Ref", "SharedFd", "kernel_identity", "share", "receive", "reduce_socket",
           "reduce_mp_connection", "sharer_address"]

logger = logging.getLogger("fiber")

_KEY_SIZE = 16
_REQUEST = struct.Struct(f"!{_KEY_SIZE}s")
_HEADER = struct.Struct("!I")  # a frame's length, then the frame
_FRAME_MAX = 1024  # the longest frame a peer may send the sharer
_GIVEN = b"\x01"  # the reply that carries the descriptor
_GONE = b"\x00"  # no descriptor under that key (taken already, or never shared)
CONNECT_TIMEOUT = 10.0  # seconds to reach the sharer, prove the secret and get the fd

_identity: tuple[str, int] | None = None


def kernel_identity() -> tuple[str, int]:
    """(boot id of this kernel, inode of this process's network namespace): two
    processes with the same identity can pass descriptors over an abstract Unix socket."""
    global _identity
    if _identity is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
                boot = file.read().strip()
        except OSError:
            boot = ""
        try:
            netns = os.stat("/proc/self/ns/net").st_ino
        except OSError:
            netns = 0
        _identity = (boot, netns)
    return _identity


class Ref(NamedTuple):
    """What a pickle carries for a handle: where its duplicate waits and under which
    key, and who sent it (for the receiver's checks and error messages)."""

    address: str
    key: bytes
    identity: tuple[str, int]
    pid: int
    what: str


# -- the sending side --------------------------------------------------------------------


class _Sharer:
    """This process's handle sharer (see the module's docstring)."""

    def __init__(self) -> None:
        from fiber.wire import auth
        from fiber.wire.gate import Gate

        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._held: dict[bytes, int] = {}
        self.address = f"fiber-handles-{self.pid}-{os.urandom(8).hex()}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + self.address)
        self._key = auth.get_authkey()
        self.failure: BaseException | None = None
        self.gate = Gate("handle sharer", self._admitted, on_death=self._died)
        self.gate.listen(self._sock, self._admission, self._renewed)

    def _renewed(self, old: socket.socket, new: socket.socket) -> None:
        self._sock = new

    def _died(self, error: BaseException) -> None:
        self.failure = error
        try:
            self._sock.close()
        except OSError:
            pass

    def _admission(self, sock: socket.socket) -> Any:
        from fiber.wire.handshake import HubHandshake

        return _ShareAdmission(HubHandshake(self._key, "a process on this host"))

    def hold(self, fd: int) -> bytes:
        """Keep a duplicate of ``fd`` for one receiver; its key."""
        if self.failure is not None:
            raise HandleError(f"this process's handle sharer stopped: {self.failure}")
        key = os.urandom(_KEY_SIZE)
        dup = os.dup(fd)
        with self._lock:
            self._held[key] = dup
        return key

    def take(self, key: bytes) -> int | None:
        with self._lock:
            return self._held.pop(key, None)

    def _admitted(self, sock: socket.socket, admission: Any) -> None:
        """An authenticated peer named a key (gate's thread; must not block: one small
        message on a fresh socket never does)."""
        fd = self.take(admission.request)
        try:
            if fd is None:
                sock.send(_GONE)
            else:
                socket.send_fds(sock, [_GIVEN], [fd])
        except OSError as exc:
            logger.debug("handing a descriptor over failed: %s", exc)
        finally:
            if fd is not None:
                os.close(fd)  # (the receiver has its own now, or nobody will)
            sock.close()

    def forget_after_fork(self) -> None:
        """In a forked child: close its copies of the parent's duplicates and socket."""
        for fd in self._held.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._held.clear()
        try:
            self._sock.close()
        except OSError:
            pass


def _frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def _share_admission_class() -> type:
    from fiber.wire.gate import FramedAdmission
    from fiber.wire.protocol import AUTH_REFUSED

    class ShareAdmission(FramedAdmission):
        """fiber's mutual handshake over length-prefixed frames (at most
        :data:`_FRAME_MAX` bytes), then one more frame: the key asked for."""

        def __init__(self, handshake: Any) -> None:
            super().__init__(_HEADER, _FRAME_MAX)
            self.handshake = handshake
            self.request = b""
            self._authenticated = False

        def message(self, fields: tuple, body: bytes) -> bytes:
            if not self._authenticated:
                reply = self.handshake.step(body)
                self.refused = self.handshake.refused
                self._authenticated = self.handshake.accepted
                return _frame(reply)
            if len(body) != _KEY_SIZE:
                self.refused = "a request that is not a key"
                return b""
            self.request = body
            self.accepted = True
            return b""

        def refuse(self, reason: str) -> bytes:
            reply = self.handshake.refuse(reason)
            self.refused = self.handshake.refused or reason
            return _frame(reply)

        def expired(self, seconds: float) -> bytes:
            expired = self.handshake.expired(seconds)
            self.refused = "too slow"
            return _frame(AUTH_REFUSED) if expired else b""

        def dropped(self, cause: object) -> None:
            self.handshake.dropped(cause)

    return ShareAdmission


def _ShareAdmission(handshake: Any) -> Any:  # noqa: N802 - a class, made on first use
    global _admission_class
    if _admission_class is None:
        _admission_class = _share_admission_class()
    return _admission_class(handshake)


_admission_class: type | None = None
_sharer: _Sharer | None = None
_sharer_lock = threading.Lock()


def _the_sharer() -> _Sharer:
    global _sharer
    with _sharer_lock:
        if _sharer is None or _sharer.pid != os.getpid():
            _sharer = _Sharer()
        return _sharer


def sharer_address() -> str | None:
    """The abstract name this process's sharer listens on, if it started (tests)."""
    return _sharer.address if _sharer is not None else None


def _after_fork_in_child() -> None:
    global _sharer
    sharer, _sharer = _sharer, None
    if sharer is not None:
        sharer.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def share(fd: int, what: str) -> Ref:
    """Duplicate ``fd`` for one other process of this kernel; the :class:`Ref` to
    pickle (``what`` names the handle in errors)."""
    sharer = _the_sharer()
    return Ref(sharer.address, sharer.hold(fd), kernel_identity(), sharer.pid, what)


# -- the receiving side ------------------------------------------------------------------


def receive(ref: Ref) -> int:
    """The descriptor ``ref`` names, duplicated into this process (a new descriptor
    of its own). Raises :class:`~fiber.errors.HandleError` when it cannot be."""
    address, key, identity, pid, what = ref
    if tuple(identity) != kernel_identity():
        raise HandleError(
            f"{what} was sent by process {pid} on another machine (or from another "
            "kernel or network namespace: another container or pod): a descriptor "
            "means nothing outside the kernel that opened it. Send data, or an "
            "address to connect to, instead (fiber.connection.Listener/Client across "
            "hosts)")
    from fiber.wire import auth
    from fiber.wire.handshake import prove

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        try:
            sock.connect("\0" + address)
        except OSError as exc:
            raise HandleError(
                f"{what}, sent by process {pid}, cannot be received: that process's "
                f"handle sharer cannot be reached ({exc}); has it exited?") from None

        def exchange(message: bytes) -> bytes:
            sock.sendall(_frame(message))
            (size,) = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
            if size > _FRAME_MAX:
                raise ConnectionResetError("a frame too long for a handshake")
            return _read_exactly(sock, size)

        try:
            prove(auth.get_authkey(), exchange, f"process {pid}'s handle sharer")
            sock.sendall(_frame(_REQUEST.pack(key)))
            msg, fds, _, _ = socket.recv_fds(sock, 1, 1)
        except (OSError, AuthenticationError) as exc:
            raise HandleError(f"{what}, sent by process {pid}, could not be received: "
                              f"{type(exc).__name__}: {exc}") from None
    finally:
        sock.close()
    if msg != _GIVEN or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise HandleError(
            f"{what}, sent by process {pid}, was received already by another process "
            "(a handle pickled once can be received once, as with multiprocessing)")
    return fds[0]


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the handle sharer closed the connection")
        data += chunk
    return data


# -- what pickles how ---------------------------------------------------------------------


def _rebuild_socket(ref: Ref, family: int, kind: int, proto: int) -> socket.socket:
    return socket.socket(family, kind, proto, fileno=receive(ref))


def reduce_socket(sock: socket.socket) -> tuple[Any, tuple[Any, ...]]:
    """A socket's pickle: its descriptor, shared (see the module's docstring)."""
    fd = sock.fileno()
    if fd < 0:
        raise OSError(errno.EBADF, "cannot send a closed socket")
    return _rebuild_socket, (share(fd, f"a socket ({_socket_kind(sock)})"), sock.family,
                             sock.type, sock.proto)


def _socket_kind(sock: socket.socket) -> str:
    try:
        return f"{socket.AddressFamily(sock.family).name}, {socket.SocketKind(sock.type).name}"
    except ValueError:
        return f"family {sock.family}"


def _rebuild_mp_connection(ref: Ref, readable: bool, writable: bool) -> Any:
    return _mp_connection.Connection(receive(ref), readable, writable)


def reduce_mp_connection(conn: Any) -> tuple[Any, tuple[Any, ...]]:
    """A :class:`multiprocessing.connection.Connection`'s pickle: its descriptor,
    shared (multiprocessing's own pickler uses its own reduction, unchanged)."""
    return _rebuild_mp_connection, (share(conn.fileno(), "a multiprocessing Connection"),
                                    conn.readable, conn.writable)


copyreg.pickle(_mp_connection.Connection, reduce_mp_connection)


class SharedFd:
    """A file descriptor to hand to another process (``fiber.reduction.DupFd``): pickled,
    it is duplicated into the process that unpickles it; :meth:`detach` returns the
    descriptor there (here: a duplicate, as multiprocessing's ``DupFd`` does)."""

    def __init__(self, fd: int) -> None:
        self._ref: Ref | None = share(fd, f"file descriptor {fd}")

    def detach(self) -> int:
        ref, self._ref = self._ref, None
        if ref is None:
            raise HandleError("this descriptor was detached already")
        return receive(ref)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        if self._ref is None:
            raise HandleError("this descriptor was detached already")
        ref, self._ref = self._ref, None  # (one receiver)
        return _rebuilt_fd, (ref,)


def _rebuilt_fd(ref: Ref) -> SharedFd:
    shared = SharedFd.__new__(SharedFd)
    shared._ref = ref
    return shared
