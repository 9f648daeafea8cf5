"""The control channel of one job-backed process, on the parent's hub: the requests
its bootstrap (:mod:`fiber.runtime.bootstrap`) sends (hello, output, heartbeat, exit,
and failed: it could not prepare the process), each handed to the process's
:class:`ControlledJob` (a :class:`fiber.runtime.popen.JobPopen`), and the parked
heartbeat (``WATCH``) by which the parent tells a connected job to end.

The parent answers each job's heartbeat every ``heartbeat_interval`` seconds, or less
often when it has many jobs beating (:func:`beat_interval`: about
:data:`BEATS_PER_SECOND` a second in all, at most every third of the timeout): at
10,000 jobs, 2,000 beats a second were a fifth of a core of the parent's (issue #29)."""

from __future__ import annotations

import pickle
import signal
import threading
import time
from typing import Any, Protocol

from fiber.wire import protocol, transport
from fiber.wire.protocol import Control

__all__ = ["BEATS_PER_SECOND", "ControlChannel", "ControlledJob", "beat_interval"]

#: heartbeats a parent answers a second, about, before it spaces them out
BEATS_PER_SECOND = 1000.0
_beating = 0  # jobs of this process whose heartbeat is under way (connected)
_count_lock = threading.Lock()


def beat_interval(interval: float, timeout: float) -> float:
    """Seconds between two heartbeats of a job (and two checks of its silence): the
    configured ``interval``, longer when this process has more jobs beating than
    :data:`BEATS_PER_SECOND` a second allows, at most ``timeout`` / 3 (two beats to
    spare before a job is taken for silent)."""
    return max(interval, min(timeout / 3, _beating / BEATS_PER_SECOND))


class ControlledJob(Protocol):
    """What a :class:`ControlChannel` reports to (a JobPopen)."""

    hub: Any
    heartbeat_interval: float
    heartbeat_timeout: float
    bundle: bytes
    exit_reported: int | None
    asked_to_end: int | None

    def write_output(self, stream: bytes, text: str) -> None: ...

    def wrong_version(self, difference: str) -> None: ...

    def connected(self, pid: int, host: str) -> None: ...

    def failed_to_prepare(self, text: str) -> None: ...

    def cannot_run_here(self, text: str) -> None: ...

    def connection_lost(self) -> None: ...


class ControlChannel:
    """Requests from one child's bootstrap: hello, output, heartbeat, exit, and
    failed (it could not prepare the process: the traceback)."""

    def __init__(self, popen: ControlledJob) -> None:
        self.popen = popen
        self.peer: int | None = None
        self._watch: transport.Request | None = None
        self._end: bytes | None = None  # ask_to_end(): what the next heartbeat answers
        self._end_lock = threading.Lock()
        self.last_seen = time.monotonic()
        self._beating = False  # counted in _beating (its first WATCH came)

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        op = bytes(payload[:1])
        body = payload[1:]
        popen = self.popen
        self.last_seen = time.monotonic()
        if op == Control.OUTPUT:
            popen.write_output(bytes(body[:1]), bytes(body[1:]).decode("utf-8", "replace"))
            request.reply(b"")
        elif op == Control.WATCH:
            previous, self._watch = self._watch, request
            if previous is not None:
                previous.reply(b"")
            if self._end is not None:
                self._send_end()
                return
            if not self._beating:
                self._count(1)
            popen.hub.call_later(beat_interval(popen.heartbeat_interval,
                                               popen.heartbeat_timeout),
                                 lambda: self._beat(request))
        elif op == Control.HELLO:
            if self.peer is not None:
                request.reply(b"this process is already running", transport.ERROR)
                return
            hello = protocol.parse_hello(body)
            different = protocol.mismatch(hello)
            if different is not None:
                popen.wrong_version(different)
                request.reply(f"refused by the parent: {different}".encode(), transport.ERROR)
                return
            self.peer = request.peer
            popen.connected(int(hello["pid"]), str(hello["host"]))
            request.reply(popen.bundle)
            popen.bundle = b""
        elif op == Control.EXIT:
            popen.exit_reported = int(pickle.loads(body))
            request.reply(b"")
        elif op == Control.FAILED:
            popen.failed_to_prepare(bytes(body).decode("utf-8", "replace"))
            request.reply(b"")
        elif op == Control.SHIPPING:
            popen.cannot_run_here(bytes(body).decode("utf-8", "replace"))
            request.reply(b"")
        else:
            request.reply(b"unknown control request", transport.ERROR)

    def ask_to_end(self, force: bool) -> None:
        """Ask the connected job to signal itself (SIGKILL with ``force``, else
        SIGTERM) through its parked heartbeat: it ends at once, whatever its cluster
        manager is doing."""
        self._end = Control.END_KILL if force else Control.END_TERM
        self.popen.hub.call_later(0, self._send_end)

    def _send_end(self) -> None:
        with self._end_lock:
            watch, end = self._watch, self._end
            if watch is None or end is None:
                return  # sent at the job's next heartbeat
            self._watch = self._end = None
        self.popen.asked_to_end = -(signal.SIGKILL if end == Control.END_KILL
                                    else signal.SIGTERM)
        watch.reply(end)

    def _beat(self, request: transport.Request) -> None:
        if self._watch is request:
            self._watch = None
            request.reply(b"")

    def _count(self, change: int) -> None:
        global _beating
        with _count_lock:
            self._beating = change > 0
            _beating += change

    def peer_gone(self, peer: int) -> None:
        if peer == self.peer:
            if self._beating:
                self._count(-1)
            self.popen.connection_lost()
