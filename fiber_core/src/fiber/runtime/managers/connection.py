"""The ``"fiber"`` serializer of managers: how a proxy reaches a manager's server.

Connections are TCP sockets wrapped in the standard library's connection class, with
two changes:

* TCP keepalive and a user timeout make a server that vanished without closing fail
  a call within seconds, and every failure of the socket (the authkey handshake
  included) raises :class:`fiber.errors.ConnectionLostError` naming the manager,
  instead of hanging or raising a bare ``EOFError``;
* an exception raised by a method in the server travels with its formatted traceback,
  re-raised in the caller with a :class:`RemoteTraceback` as its ``__cause__``
  (multiprocessing.pool's class, as the pool's remote exceptions carry).

The authkey is the run's secret (:func:`fiber.wire.auth.get_authkey`); the handshake
is done by the listener's gate on the server's side (:class:`Listener`) and by
:func:`Client` here.
"""

from __future__ import annotations

import queue
import socket
import sys
import traceback
from multiprocessing.pool import (  # type: ignore[attr-defined]  # missing from typeshed
    RemoteTraceback,  # loaded by multiprocessing.managers already
)
from typing import Any

from fiber.errors import ConnectionLostError
from fiber.runtime.managers import stdlib
from fiber.runtime.managers.admission import MpAdmission, peer_name
from fiber.runtime.managers.stdlib import ERROR
from fiber.wire import auth
from fiber.wire.gate import Gate

__all__ = ["SERIALIZER", "CONNECT_TIMEOUT", "DEAD_PEER_TIMEOUT", "RemoteTraceback",
           "Listener", "Client", "ServerConnection", "ClientConnection", "share_authkey"]

SERIALIZER = "fiber"
CONNECT_TIMEOUT = 5.0      # seconds to reach a manager's server
DEAD_PEER_TIMEOUT = 6.0    # a server that stops answering TCP is given up after this


def _tune(sock: socket.socket) -> None:
    """Low latency and prompt detection of a peer that vanished without closing."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3),
                        ("TCP_USER_TIMEOUT", int(DEAD_PEER_TIMEOUT * 1000))):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _is_error(obj: Any) -> bool:
    return (isinstance(obj, tuple) and len(obj) == 2 and obj[0] == ERROR
            and isinstance(obj[1], BaseException))


def _settle_output() -> None:
    """In a job, the lines the server printed reach the parent's terminal before the
    reply that follows them (the job's output goes to its parent by another route)."""
    for stream in (sys.stdout, sys.stderr):
        settle = getattr(stream, "settle", None)
        if settle is not None:
            settle()


class ServerConnection(stdlib.Connection):
    """The server's end: an exception sent back carries its formatted traceback; a
    reply goes after the lines printed before it. ``admitted``: authenticated already
    (by the listener's gate)."""

    admitted = False

    def send(self, obj: Any) -> None:
        _settle_output()
        if _is_error(obj) and obj[1].__traceback__ is not None:
            exc = obj[1]
            try:
                exc._fiber_remote_tb = "".join(traceback.format_exception(exc))
            except (AttributeError, TypeError):  # an exception type without __dict__
                pass
        super().send(obj)


class ClientConnection(stdlib.Connection):
    """A proxy's end: a lost server raises ConnectionLostError; a remote exception gets
    its traceback as ``__cause__``."""

    address: tuple = ()
    server = "the manager"  # what serves the objects, as error messages name it

    def _lost(self, exc: BaseException) -> ConnectionLostError:
        host, port = self.address[:2] if self.address else ("?", "?")
        return ConnectionLostError(
            f"{self.server} at {host}:{port} is gone ({type(exc).__name__}: {exc}); its "
            "process has ended or its host is unreachable")

    # the lowest level: also covers send_bytes/recv_bytes (the authkey handshake)
    def _send(self, buf: Any, *args: Any) -> None:
        try:
            super()._send(buf, *args)  # type: ignore[misc]
        except OSError as exc:
            raise self._lost(exc) from None

    def _recv(self, size: int, *args: Any) -> Any:
        try:
            return super()._recv(size, *args)  # type: ignore[misc]
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None

    def send(self, obj: Any) -> None:
        try:
            super().send(obj)
        except ConnectionLostError:
            raise
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None

    def recv(self) -> Any:
        try:
            obj = super().recv()
        except ConnectionLostError:
            raise
        except (OSError, EOFError) as exc:
            raise self._lost(exc) from None
        if _is_error(obj):
            text = getattr(obj[1], "_fiber_remote_tb", None)
            if text:
                obj[1].__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
        return obj


class Listener:
    """A manager server's listening socket (``Listener`` of the "fiber" serializer).

    Once its server calls :meth:`admit` (:class:`~fiber.runtime.managers.serving.FiberServer`
    does), connections are authenticated by a gate (:mod:`fiber.wire.gate`: no thread,
    bounded memory and a deadline per stranger) and :meth:`accept` returns only
    authenticated ones, marked ``admitted``. Before that (the standard library's own
    server), ``accept`` returns every connection and the server's handler threads
    authenticate them."""

    def __init__(self, address: tuple, family: str | None = None, backlog: int = 16,
                 authkey: bytes | None = None) -> None:
        host = address[0]
        family_ = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server(tuple(address), family=family_, backlog=backlog)
        self.address = self._sock.getsockname()[:2]
        self._gate: Gate | None = None
        self._admitted: queue.SimpleQueue[ServerConnection | None] = queue.SimpleQueue()
        self.closed = False

    def admit(self, authkey: bytes, what: str = "a manager's server") -> None:
        """Authenticate connections with ``authkey`` on a gate from now on."""
        key = bytes(authkey)
        self._gate = Gate("manager", self._take, on_death=self._gate_died)
        self._gate.listen(self._sock, lambda sock: MpAdmission(key, peer_name(sock), what),
                          self._renewed)

    def _renewed(self, old: socket.socket, new: socket.socket) -> None:
        """The gate listens on a new socket at the same address (the old one's
        descriptor was closed behind its back): :meth:`close` closes it."""
        self._sock = new
        if self.closed:
            new.close()

    def _gate_died(self, error: BaseException) -> None:
        """Nothing can be admitted any more: stop (proxies connecting are refused at
        once, and the server's accepting loop ends)."""
        self.closed = True
        self._admitted.put(None)
        try:
            self._sock.close()
        except OSError:
            pass

    def _take(self, sock: socket.socket, admission: Any) -> None:
        sock.setblocking(True)
        _tune(sock)
        conn = ServerConnection(sock.detach())
        conn.admitted = True
        self._admitted.put(conn)

    def accept(self) -> ServerConnection:
        if self._gate is not None:
            conn = self._admitted.get()
            if conn is None:
                self._admitted.put(None)  # for every other thread in accept()
                raise OSError("the listener is closed")
            return conn
        sock, _ = self._sock.accept()
        _tune(sock)
        return ServerConnection(sock.detach())

    def close(self) -> None:
        self.closed = True
        if self._gate is not None:
            self._gate.close()
            self._admitted.put(None)
        self._sock.close()


def Client(address: tuple, family: str | None = None,
           authkey: bytes | None = None, *, server: str = "the manager") -> ClientConnection:
    """Connect to a manager's server (``Client`` of the "fiber" serializer); errors
    name what serves there as ``server`` says."""
    host, port = address[:2]
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    except OSError as exc:
        raise ConnectionLostError(
            f"cannot reach {server} at {host}:{port} ({exc}): its process has ended, "
            "or this host cannot reach that address (see the listen_address setting)"
        ) from None
    sock.settimeout(None)
    _tune(sock)
    conn = ClientConnection(sock.detach())
    conn.server = server
    conn.address = tuple(address)
    if authkey is not None:
        try:
            stdlib.authenticate(conn, authkey)
        except BaseException:
            conn.close()
            raise
    return conn


stdlib.register_serializer(SERIALIZER, Listener, Client)


def share_authkey() -> None:
    """multiprocessing's authkey becomes the run's secret, so that proxies of user-made
    proxy classes that pickle through the standard library authenticate too (done on
    first use, never at import: a preloading fork server imports fiber before it knows
    the run)."""
    stdlib.set_process_authkey(auth.get_authkey())
