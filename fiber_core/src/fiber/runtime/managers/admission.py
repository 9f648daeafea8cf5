"""multiprocessing's authkey handshake, the server's half, as fiber's gate drives it.

A manager's server, the server of shared objects and :class:`fiber.connection.Listener`
speak multiprocessing's handshake (the server challenges the client, then answers the
client's challenge), so that the standard library's clients and proxies can connect.
The standard library runs it with blocking reads on a thread per connection; here it is
a :class:`~fiber.wire.gate.FramedAdmission`: a stranger costs no thread, at most 256
bytes a message and the gate's deadline (:mod:`fiber.wire.gate`). A failed attempt is
logged like the hub's (a warning naming the peer, rate-limited) and answered with
multiprocessing's failure message only, never a traceback.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Callable

from fiber.runtime.managers import stdlib
from fiber.wire.gate import FramedAdmission, RateLimitedLog

__all__ = ["MpAdmission", "peer_name"]

logger = logging.getLogger("fiber")
_log = RateLimitedLog()

_HEADER = struct.Struct("!i")  # multiprocessing's message length
_LIMIT = 256  # what the standard library reads of a handshake message


def _frame(body: bytes) -> bytes:
    return _HEADER.pack(len(body)) + body


def peer_name(sock: socket.socket) -> str:
    """Who is at the other end of an accepted connection, for the log."""
    try:
        peer = sock.getpeername()
    except OSError:
        return "a peer that left"
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return "a process on this host"


class MpAdmission(FramedAdmission):
    """The server's half of multiprocessing's authkey handshake with one connection."""

    def __init__(self, authkey: bytes, peer: str, what: str = "a fiber server") -> None:
        super().__init__(_HEADER, _LIMIT)
        self._key = bytes(authkey)
        self._challenge = stdlib.new_challenge()
        self._step = 0
        self.peer = peer
        self.what = what
        self.accepted = False
        self.refused = None
        self.on_wrong_key: Callable[[], None] | None = None  # called when it answers wrong

    def opening(self) -> bytes:
        return _frame(stdlib.CHALLENGE + self._challenge)

    def message(self, fields: tuple, body: bytes) -> bytes:
        if self._step == 0:  # the client's answer to our challenge
            if not stdlib.verify_response(self._key, self._challenge, body):
                if self.on_wrong_key is not None:
                    self.on_wrong_key()
                return self._refuse("a wrong answer to the authkey challenge",
                                    _frame(stdlib.FAILURE))
            self._step = 1
            return _frame(stdlib.WELCOME)
        if self._step == 1:  # the client's challenge to us
            if not body.startswith(stdlib.CHALLENGE):
                return self._refuse("its second message is not an authkey challenge")
            self._step = 2
            return _frame(stdlib.response_to(self._key, body[len(stdlib.CHALLENGE):]))
        if body != stdlib.WELCOME:  # the client's verdict on our answer
            return self._refuse("it rejected this process's answer (another authkey)")
        self.accepted = True
        return b""

    def _refuse(self, reason: str, goodbye: bytes = b"") -> bytes:
        self.refused = reason
        _log.warning("%s refused a connection from %s: %s", self.what, self.peer, reason)
        return goodbye

    def refuse(self, reason: str) -> bytes:
        return self._refuse(reason)

    def expired(self, seconds: float) -> bytes:
        if not self.accepted and self.refused is None:
            self.refused = "too slow"
            _log.warning("%s closed a connection from %s that did not complete the "
                         "authkey handshake within %gs", self.what, self.peer, seconds)
        return b""

    def dropped(self, cause: object) -> None:
        if not self.accepted and self.refused is None:
            logger.debug("a connection from %s to %s dropped during the handshake (%s)",
                         self.peer, self.what, cause)
