"""The mutual handshake that opens every fiber connection, written once for both wires.

Before a hub reads anything else from a connection, both sides prove they hold the
run's secret by answering each other's random challenge (the messages are in
:mod:`fiber.wire.protocol`, the HMAC in :mod:`fiber.wire.auth`). The wires only carry
the messages:

- the hub's side is a small state object per connection, :class:`HubHandshake`: every
  message the connection sends goes to :meth:`HubHandshake.step`, which returns the
  reply to send back and records the verdict (``accepted``, or ``refused`` and why).
  The nng hub drives it from its event loop (one object per pipe), the stream listener
  from its gate (:mod:`fiber.wire.gate`: one thread for every pending connection).
- the connecting side is one function, :func:`prove`, given the wire's request/reply
  exchange.

What a hub logs about connections that do not get through is said here too, so both
wires say it alike: a connection that sends a wrong proof (or something that is not a
fiber handshake) is a warning naming the peer; one that drops before it finished is
only worth a debug line (a process that exits while it connects is no attacker).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fiber.errors import AuthenticationError
from fiber.wire import auth
from fiber.wire.gate import RateLimitedLog
from fiber.wire.protocol import (
    AUTH1,
    AUTH3,
    AUTH_REFUSED,
    AUTH_TIMEOUT,
    CLIENT_ROLE,
    HUB_ROLE,
    NONCE_SIZE,
    OK,
)

__all__ = ["HubHandshake", "prove"]

logger = logging.getLogger("fiber")
# a flood of strangers is a few lines a minute, not one per connection
_log = RateLimitedLog()


class HubHandshake:
    """The hub's half of the handshake with one connection, from ``peer`` (its address,
    for the log). Feed each message of the connection to :meth:`step` and send back
    what it returns, until :attr:`accepted` or :attr:`refused` is set; after a refusal
    the wire closes the connection."""

    __slots__ = ("_key", "_nonce", "peer", "accepted", "refused")

    def __init__(self, key: bytes, peer: str) -> None:
        self._key = key
        self._nonce: bytes | None = None  # the challenge sent, once the client's came
        self.peer = peer
        self.accepted = False
        self.refused: str | None = None  # why, once refused

    @property
    def started(self) -> bool:
        """Whether the client's challenge came (it speaks fiber's handshake)."""
        return self._nonce is not None

    def step(self, message: bytes) -> bytes:
        """The reply to the connection's next message (a status byte first)."""
        if self.accepted or self.refused is not None:
            return self.refuse("a handshake message after the handshake ended")
        if self._nonce is None:
            if message[:2] != AUTH1 or len(message) != 2 + NONCE_SIZE:
                return self.refuse("its first message is not a fiber handshake")
            self._nonce = auth.new_nonce()
            return OK + self._nonce + auth.answer(self._key, HUB_ROLE, message[2:])
        if message[:2] != AUTH3:
            return self.refuse("its second message is not a fiber handshake")
        if not auth.verify(self._key, CLIENT_ROLE, self._nonce, message[2:]):
            return self.refuse("a wrong proof of the run's secret")
        self.accepted = True
        return OK

    def refuse(self, reason: str) -> bytes:
        """Refuse the connection (the wire saw something wrong itself, say an oversized
        frame); the reply to send before closing it. Logged as a warning."""
        self.refused = reason
        _log.warning("refused a connection from %s: %s", self.peer, reason)
        return AUTH_REFUSED

    def dropped(self, cause: object = "closed") -> None:
        """The connection ended before the handshake did (logged at debug level)."""
        if self.accepted or self.refused is not None:
            return
        logger.debug("a connection from %s dropped during the handshake (%s)",
                     self.peer, cause)

    def expired(self, seconds: float = AUTH_TIMEOUT) -> bool:
        """The connection's ``seconds`` to authenticate are up: True (logged as a
        warning) when it has not, and the wire closes it."""
        if self.accepted or self.refused is not None:
            return False
        self.refused = "too slow"
        _log.warning("closing a connection from %s that did not complete the handshake "
                     "within %gs", self.peer, seconds)
        return True


def prove(key: bytes, exchange: Callable[[bytes], bytes], address: str) -> None:
    """The connecting side of the handshake with the hub at ``address``, over
    ``exchange`` (sends a message, returns the reply). Raises
    :class:`~fiber.errors.AuthenticationError` when the hub does not hold ``key`` or
    refuses it; the wire's own errors (a lost connection) pass through."""
    nonce = auth.new_nonce()
    reply = exchange(AUTH1 + nonce)
    if reply[:1] != OK or not auth.verify(key, HUB_ROLE, nonce, reply[1 + NONCE_SIZE:]):
        raise AuthenticationError(f"the process at {address} does not hold this run's secret")
    hub_nonce = reply[1:1 + NONCE_SIZE]
    if exchange(AUTH3 + auth.answer(key, CLIENT_ROLE, hub_nonce))[:1] != OK:
        raise AuthenticationError(f"the process at {address} rejected this run's secret")
