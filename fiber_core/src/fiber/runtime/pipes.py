"""The owner's side of a :func:`fiber.Pipe`: a :class:`PipeChannel` holds the two
mailboxes of a pipe in the process that created it and counts the handles of each
end (local, sent to other processes, in transit), so that an end closes when its last
handle does.

Copies of an end pickled into a Process's payload are *in transit* until that process
receives them; :func:`recording_transit` collects them so that they can be released
(:func:`release_transit`) if the process ends before it does.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

from fiber.runtime.mailbox import Mailbox, decode
from fiber.wire import transport
from fiber.wire.protocol import PIPE_TOKEN as _TOKEN
from fiber.wire.protocol import MailboxOp as Op
from fiber.wire.protocol import PipeOp

__all__ = ["PipeChannel", "recording_transit", "release_transit", "record_transit"]

_tokens = itertools.count(1)
#: the pipe ends pickled for one Process: (channel, token) of each copy
Transit = list[tuple["PipeChannel", int]]
_recording = threading.local()


@contextlib.contextmanager
def recording_transit() -> Iterator[Transit]:
    """Collect the pipe ends pickled in this block (the payload of a Process), so that
    they can be released if that process ends before receiving them."""
    previous = getattr(_recording, "log", None)
    log: Transit = []
    _recording.log = log
    try:
        yield log
    finally:
        _recording.log = previous


def release_transit(log: Transit) -> None:
    """The process that was to receive these copies has ended."""
    for channel, token in log:
        channel.drop_token(token)


class PipeChannel:
    """Two mailboxes; side ``i`` reads ``boxes[i]`` and writes ``boxes[1 - i]``."""

    def __init__(self, hub: transport.Hub) -> None:
        self.boxes = (Mailbox(hub), Mailbox(hub))
        self.local_handles = [0, 0]
        self.in_transit: dict[int, int] = {}  # token of a pickled copy -> its side
        self.remote_peers: list[dict[int, int]] = [{}, {}]  # peer -> handles it holds
        # reentrant: handles are released by finalizers, which may run inside this lock
        self.lock = threading.RLock()

    def close_side(self, side: int) -> None:
        self.boxes[1 - side].close()  # the other end reads EOF once drained
        with self.boxes[side].lock:
            self.boxes[side].reader_closed = True  # the other end's sends fail
        self.boxes[side].discard()  # nobody will read what is left (shared segments)

    def _unused(self, side: int) -> bool:
        return (self.local_handles[side] == 0 and side not in self.in_transit.values()
                and not self.remote_peers[side])

    def new_token(self, side: int) -> int:
        with self.lock:
            token = next(_tokens)
            self.in_transit[token] = side
            return token

    def drop_token(self, token: int) -> None:
        """A pickled copy will never arrive (or arrived as a local handle)."""
        with self.lock:
            side = self.in_transit.pop(token, None)
            if side is None:
                return
            last = self._unused(side)
        if last:
            self.close_side(side)

    def release_local(self, side: int) -> None:
        with self.lock:
            self.local_handles[side] -= 1
            last = self._unused(side)
        if last:
            self.close_side(side)

    def _release_remote(self, side: int, peer: int, everything: bool = False) -> None:
        with self.lock:
            held = self.remote_peers[side].get(peer, 0)
            if everything or held <= 1:
                self.remote_peers[side].pop(peer, None)
            else:
                self.remote_peers[side][peer] = held - 1
            last = self._unused(side)
        if last:
            self.close_side(side)

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        """Answer a request; raises :class:`ValueError` for a malformed one (the hub
        answers it with an error)."""
        side = payload[0] if len(payload) else -1
        if side not in (0, 1):
            raise ValueError("a pipe request for no side of the pipe")
        op, timeout, data = decode(payload[1:])
        if op == PipeOp.RECEIVED:  # a process received a copy of this end
            if len(data) < _TOKEN.size:
                raise ValueError("a pipe's RECEIVED request without its token")
            with self.lock:
                self.in_transit.pop(_TOKEN.unpack_from(data)[0], None)
                peers = self.remote_peers[side]
                peers[request.peer] = peers.get(request.peer, 0) + 1
            request.reply(b"")
        elif op == PipeOp.RELEASED:
            self._release_remote(side, request.peer)
            request.reply(b"")
        elif op == Op.PUT or op == Op.PUT_SHARED:
            self.boxes[1 - side].handle(request, op, timeout, data)
        else:
            self.boxes[side].handle(request, op, timeout, data)

    def peer_gone(self, peer: int) -> None:
        for side in (0, 1):
            self.boxes[side].peer_gone(peer)
            if peer in self.remote_peers[side]:
                self._release_remote(side, peer, everything=True)


def record_transit(channel: PipeChannel, token: int) -> None:
    """A copy of an end of ``channel`` was pickled (with ``token``): note it if a
    Process payload is being recorded on this thread."""
    log = getattr(_recording, "log", None)
    if log is not None:
        log.append((channel, token))
