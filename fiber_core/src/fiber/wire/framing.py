"""The bytes of a request and the reading of a reply, shared by both wires
(:mod:`fiber.wire.nng_client` over pynng, :mod:`fiber.wire.stream.client` over
sockets; the stream wire's own frame header is :mod:`fiber.wire.stream.framing`)."""

from __future__ import annotations

from fiber.errors import ConnectionLostError
from fiber.wire.protocol import CHANNEL, GONE, MSG, OK
from fiber.wire.serialization import unpack_exception

__all__ = ["request_frame", "check_reply"]


def request_frame(channel: int, payload: bytes) -> bytes:
    """A request for ``channel`` of a hub."""
    return MSG + CHANNEL.pack(channel) + payload


def check_reply(reply: bytes, address: str) -> bytes:
    """The payload of an OK reply; raises :class:`ConnectionLostError` for a channel
    that is gone, and for another status (ERROR) the exception its reply carries when
    it is a packed one, else :class:`ConnectionLostError` (a plain message: its text is
    the error's)."""
    status = reply[:1]
    if status == OK:
        return reply[1:]
    if status == GONE:
        raise ConnectionLostError(f"the object at {address} no longer exists")
    try:
        exc = unpack_exception(reply[1:])
    except Exception:  # noqa: BLE001 - the hub sent a plain message
        exc = ConnectionLostError(reply[1:].decode("utf-8", "replace"))
    raise exc
