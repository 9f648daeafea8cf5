"""The parent's side of a transfer: the *ship channel* a job's stub fetches archives
from, on the parent's hub.

It is a stream channel of the hub like any other, so only a connection that proved
the run's secret reaches it (the hub's gate holds strangers to bounded memory, no
thread and a deadline), and it runs on the hub's threads: no thread of its own. It
serves the archives this process offered and nothing else, by key:

``INFO + key``
    ``{"size": bytes, "sha256": hex}`` of the archive (JSON);
``READ + key + offset``
    the archive's bytes from ``offset`` (8 bytes, little endian), at most
    :data:`CHUNK` of them, read from the store with ``pread`` (the reply is the only
    buffer).

Each archive sent to its end is counted (:func:`sent`) and logged at INFO level, so
that a run says how many transfers its jobs needed.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import threading
from collections import Counter

from fiber.runtime.ship.archive import Archive
from fiber.wire import transport

__all__ = ["CHUNK", "INFO", "READ", "ShipChannel", "sent"]

logger = logging.getLogger("fiber")

INFO, READ = b"I", b"R"
OFFSET = struct.Struct("<Q")
KEY_SIZE = 64
#: the most bytes one READ answers
CHUNK = 1 << 20

_lock = threading.Lock()
_sent: Counter[str] = Counter()


def sent() -> dict[str, int]:
    """How many times each archive (by key) was sent whole by this process."""
    with _lock:
        return dict(_sent)


class ShipChannel:
    """Serves the archives :meth:`offer` was given."""

    def __init__(self) -> None:
        self._archives: dict[bytes, tuple[Archive, int]] = {}
        self._lock = threading.Lock()

    def offer(self, archive: Archive) -> None:
        key = archive.key.encode()
        with self._lock:
            if key in self._archives:
                return
            fd = os.open(archive.path, os.O_RDONLY)  # (kept: the store may evict it)
            self._archives[key] = (archive, fd)

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        op = bytes(payload[:1])
        key = bytes(payload[1:1 + KEY_SIZE])
        found = self._archives.get(key)
        if found is None:
            request.reply(b"this process does not ship an archive " + key[:16],
                          transport.ERROR)
            return
        archive, fd = found
        if op == INFO:
            request.reply(json.dumps({"size": archive.size,
                                      "sha256": archive.sha256}).encode())
            return
        if op != READ or len(payload) != 1 + KEY_SIZE + OFFSET.size:
            request.reply(b"unknown ship request", transport.ERROR)
            return
        (offset,) = OFFSET.unpack(payload[1 + KEY_SIZE:])
        try:
            data = os.pread(fd, min(CHUNK, max(0, archive.size - offset)), offset)
        except OSError as exc:
            request.reply(f"cannot read the archive: {exc}".encode(), transport.ERROR)
            return
        request.reply(data)
        if data and offset + len(data) >= archive.size:
            with _lock:
                _sent[archive.key] += 1
            logger.info("sent the program's %s (archive %s, %.1f MiB) to a job",
                        archive.kind, archive.key[:12], archive.size / 2**20)

    def peer_gone(self, peer: int) -> None:
        pass  # (nothing is kept per peer)

    def close(self) -> None:
        with self._lock:
            for _, fd in self._archives.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._archives.clear()
