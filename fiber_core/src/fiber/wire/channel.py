"""What a channel of a hub is, and the request it is handed, whichever wire carried it.

A queue, a pipe, a pool, a child's control line are each a *channel* of their process's
hub (:mod:`fiber.wire.hub`): it gets every request addressed to it, on the thread of
the wire that received it, and answers each exactly once, now or later (a request that
must wait is *parked*). The nng wire and the stream wire hand channels requests with
the same interface, so a channel cannot tell them apart.
"""

from __future__ import annotations

from typing import Protocol

from fiber.wire.protocol import OK

__all__ = ["Channel", "Request"]


class Request(Protocol):
    """A request received by a hub, to be answered once with :meth:`reply`."""

    peer: int  # the connection it came on (see Channel.peer_gone)
    answered: bool

    def reply(self, data: bytes, status: bytes = OK) -> bool:
        """Send the reply; False when the requester is gone or it was answered."""
        ...


class Channel(Protocol):
    def handle(self, request: Request, payload: memoryview) -> None:
        """Answer (now or later) a request; called on the thread of its wire."""
        ...

    def peer_gone(self, peer: int) -> None:
        """A connected process went away: drop what it waited for."""
        ...
