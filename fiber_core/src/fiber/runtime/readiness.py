"""Readiness descriptors: what ``Connection.fileno()`` returns for a fiber pipe end.

A fiber pipe end has no socket of its own: its messages wait in a mailbox, in this
process or in another one, perhaps on another host. So that ``select``,
:mod:`selectors` and :func:`multiprocessing.connection.wait` can watch it, an end
that is asked for its ``fileno()`` gets a :class:`Flag`, a descriptor (an eventfd, or
a pipe where there is none) that is readable exactly while a message can be received
from the end's mailbox or the end is at EOF: level-triggered, as a socket's
readability is. A watcher keeps it true:

* :class:`LocalWatch`, when the mailbox lives in this process: the mailbox calls it,
  under its lock, whenever its items or its closed flag change (no thread).
* :class:`RemoteWatch`, when it lives in another process: a thread parks a ``POLL``
  request at the owner's hub (answered when a message arrives or the writing end
  closes) and raises the flag; after this process takes a message, the reader asks
  again at once (:meth:`RemoteWatch.refresh`), so the flag falls when nothing is left.
  Replies are applied in the order their requests were made, so an old answer never
  overrides a newer one. A lost owner raises the flag: the next ``recv()`` reports
  the error.

Both are created on the first ``fileno()`` call (ends that never call it pay nothing)
and closed with the end.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from typing import Protocol

from fiber import threads
from fiber.errors import FiberThreadError
from fiber.runtime.mailbox import EMPTY, encode
from fiber.wire import transport
from fiber.wire.protocol import MailboxOp as Op

__all__ = ["Flag", "LocalWatch", "RemoteWatch", "Watch"]

#: a remote watcher's parked poll is answered "empty" by the owner after this many
#: seconds and asked again (a watcher that went away leaves its request parked at
#: the owner at most this long)
PARK_SECONDS = 30.0


class Flag:
    """A file descriptor that is readable while the flag is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.is_set = False
        if hasattr(os, "eventfd"):
            self._read = self._write = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._eventfd = True
        else:  # no eventfd (not Linux): a non-blocking pipe
            self._read, self._write = os.pipe()
            os.set_blocking(self._read, False)
            os.set_blocking(self._write, False)
            self._eventfd = False

    def fileno(self) -> int:
        return self._read

    def set(self, ready: bool) -> None:
        """Make the descriptor readable (``ready``) or not."""
        with self._lock:
            if self._read < 0 or ready == self.is_set:
                return
            self.is_set = ready
            if self._eventfd:
                if ready:
                    os.eventfd_write(self._write, 1)
                else:
                    os.eventfd_read(self._read)
            elif ready:
                os.write(self._write, b"\0")
            else:
                os.read(self._read, 16)

    def close(self) -> None:
        with self._lock:
            if self._read < 0:
                return
            os.close(self._read)
            if self._write != self._read:
                os.close(self._write)
            self._read = self._write = -1


class Watch(Protocol):
    """What a pipe end holds once asked for its ``fileno()``; ``error`` is set when
    its readiness can no longer be known (the end's reads raise it)."""

    error: FiberThreadError | None

    def fileno(self) -> int: ...

    def refresh(self) -> None: ...

    def close(self) -> None: ...


class Mailboxlike(Protocol):
    def watch(self, fn: Callable[[bool], None]) -> None: ...

    def unwatch(self, fn: Callable[[bool], None]) -> None: ...


class LocalWatch:
    """The readiness of a mailbox of this process, set by the mailbox itself."""

    error: FiberThreadError | None = None  # (no thread)

    def __init__(self, mailbox: Mailboxlike) -> None:
        self._flag = Flag()
        self._mailbox: Mailboxlike | None = mailbox
        mailbox.watch(self._flag.set)

    def fileno(self) -> int:
        return self._flag.fileno()

    def refresh(self) -> None:
        """Nothing to do: the mailbox tells every change."""

    def close(self) -> None:
        mailbox, self._mailbox = self._mailbox, None
        if mailbox is not None:
            mailbox.unwatch(self._flag.set)
        self._flag.close()


class RemoteWatch:
    """The readiness of a mailbox of another process, asked through its hub.

    ``prefix`` + a mailbox request is what the end sends (a pipe's side byte) on the
    watcher's own line; ``request(mailbox request)`` is the end's own request
    function, which adds the prefix itself.
    """

    def __init__(self, address: str, cid: int, prefix: bytes,
                 request: Callable[[bytes], bytes]) -> None:
        self._flag = Flag()
        self._cid = cid
        self._prefix = prefix
        self._request = request  # the end's own request line (the reader's thread)
        self._cond = threading.Condition()
        self._seq = itertools.count(1)
        self._applied = 0
        self._closed = False
        self._ctx = transport.get_client(address).context()  # the watcher's own line
        self.refresh()  # true from the start
        #: the watcher thread's death: the end shows readable (waiters wake), and its
        #: reads raise this (their owner checks it) rather than trust a stale readiness
        self.error: FiberThreadError | None = None
        self._thread = threads.start("fiber-conn-watch", self._watch, fails=self._died)

    def _died(self, error: FiberThreadError) -> None:
        with self._cond:
            self.error = error
            if not self._closed:
                self._flag.set(True)
            self._cond.notify_all()

    def fileno(self) -> int:
        return self._flag.fileno()

    def _apply(self, seq: int, ready: bool) -> None:
        with self._cond:
            if seq > self._applied and not self._closed:
                self._applied = seq
                self._flag.set(ready)
                self._cond.notify_all()

    def refresh(self) -> None:
        """Ask the owner now (after this process took a message). Never raises: a
        lost owner makes the end readable, and its next ``recv()`` raises."""
        with self._cond:
            seq = next(self._seq)
        try:
            reply = self._request(encode(Op.POLL, 0))  # (request adds the prefix)
        except Exception:  # noqa: BLE001 - reported by the next recv()
            ready = True
        else:
            ready = reply[:1] != EMPTY
        self._apply(seq, ready)

    def _watch(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or not self._flag.is_set)
                if self._closed:
                    return
                seq = next(self._seq)
            try:
                self._ctx.send(self._cid, self._prefix + encode(Op.POLL, PARK_SECONDS))
                reply = self._ctx.recv()
            except Exception:  # noqa: BLE001 - closed by us, or the owner is gone
                self._apply(seq, True)  # (ignored once closed) recv() will tell
                return
            self._apply(seq, reply[:1] != EMPTY)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._ctx.close()  # withdraws a parked poll: the watcher's recv returns
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)
        self._flag.close()
