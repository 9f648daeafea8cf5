"""How a process reaches a mailbox-backed object (queue, pipe) that may live in
another process: directly when it lives here, else through a client connection to
the owner's hub, with one request line per thread so that a thread blocked in
``get`` does not hold up another thread's ``put``.

**Fork.** A process forked from this one (``os.fork``, multiprocessing's ``fork``
start method) holds copies of every object here, and they must not use the parent's
mailboxes or connections, which live on in the parent only. Objects that hold such
state register with :func:`fork_aware` and are told after a fork
(``_after_fork_in_child``): an endpoint forgets its local channel and its request lines
(the child reaches the owner, its parent, through the wire: see
:mod:`fiber.wire.transport`). A pipe end the child inherits is one more handle of that
end, as multiprocessing's inherited descriptor is: :func:`hold_while_forked` keeps it
open until every process forked with it has exited (a pipe's write end that only the
children hold tells the parent), unless the child registers or closes it before.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from fiber import threads
from fiber.runtime.mailbox import encode, parse_owner
from fiber.wire import shm, transport
from fiber.wire.protocol import MailboxOp

logger = logging.getLogger("fiber")

# A remote wait with a timeout is timed out by the owner; this much longer the
# caller waits for the owner's answer before it calls the connection lost.
TIMEOUT_SLACK = 30.0


_fork_aware: weakref.WeakSet[Any] = weakref.WeakSet()
_fork_releases: list[Callable[[], None]] = []  # taken by _before_fork for the next child
_fork_pipe: tuple[int, int] | None = None
_held_in_child: list[int] = []  # in a forked child: write ends kept open for its life
# in a forked child: the parent's request lines and watchers, never collected (closing
# an nng object after a fork aborts the process)
_kept_in_child: list[Any] = []


def keep_in_child(obj: Any) -> None:
    """Keep ``obj`` (state of the parent a forked child drops) alive forever."""
    _kept_in_child.append(obj)


def fork_aware(obj: Any) -> None:
    """Call ``obj._after_fork_in_child()`` in a process forked from this one (and
    ``obj._before_fork()`` in this one before, if it has one)."""
    _fork_aware.add(obj)


def hold_while_forked(release: Callable[[], None]) -> None:
    """Called from a ``_before_fork``: run ``release()`` in this process once the
    child about to be forked (and every process forked from it) has exited."""
    _fork_releases.append(release)


def _before_fork() -> None:
    global _fork_pipe
    for obj in list(_fork_aware):
        hook = getattr(obj, "_before_fork", None)
        if hook is not None:
            hook()
    if _fork_releases:
        _fork_pipe = os.pipe()  # not inherited by programs the child executes


def _after_fork_in_parent() -> None:
    global _fork_pipe
    releases = _fork_releases[:]
    _fork_releases.clear()
    if _fork_pipe is None:
        return
    read_end, write_end = _fork_pipe
    _fork_pipe = None
    os.close(write_end)
    fd = [read_end]  # (closed once, by whichever of the two below runs first)
    threads.start("fiber-fork-holds", _release_when_gone, fd, releases,
                  fails=lambda error: _release_now(fd, releases))


def _release_when_gone(fd: list[int], releases: list[Callable[[], None]]) -> None:
    try:
        while os.read(fd[0], 1):  # EOF: every holder of the write end has exited
            pass
    except OSError:
        pass
    finally:
        os.close(fd.pop())
    for release in releases:
        release()


def _release_now(fd: list[int], releases: list[Callable[[], None]]) -> None:
    """The thread waiting for the forked children died: free what they held now
    (a pipe's other end may then see EOF while a forked child could still write,
    rather than never: its ``recv()`` would wait for ever)."""
    if fd:
        os.close(fd.pop())
    for release in releases:
        try:
            release()
        except Exception:  # noqa: BLE001 - the others are freed all the same
            logger.exception("freeing what a forked child held failed")


def _after_fork_in_child() -> None:
    global _fork_pipe
    _fork_releases.clear()
    if _fork_pipe is not None:
        os.close(_fork_pipe[0])
        _held_in_child.append(_fork_pipe[1])
        _fork_pipe = None
    for obj in list(_fork_aware):
        obj._after_fork_in_child()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class Endpoint:
    def __init__(self, address: str, cid: int) -> None:
        self.address = address
        self.cid = cid
        self._local = None
        self._tls = threading.local()
        self._shm_owner: int | None | bool = False  # False: not asked yet
        hub = transport.local_hub(address)
        if hub is not None:
            self._local = hub.channel(cid)
        fork_aware(self)

    def _after_fork_in_child(self) -> None:
        self._local = None  # the owner is the parent now
        keep_in_child(self._tls)
        self._tls = threading.local()  # the parent's request lines are not ours
        self._shm_owner = False

    @property
    def local(self):
        """The channel object when it lives in this process, else None."""
        return self._local

    def request(self, payload: bytes, timeout: float | None = None) -> bytes:
        ctx = getattr(self._tls, "ctx", None)
        if ctx is None or ctx._client.lost:
            ctx = self._tls.ctx = transport.get_client(self.address).context()
        return ctx.request(self.cid, payload,
                           None if timeout is None else timeout + TIMEOUT_SLACK)

    def shm_owner(self, prefix: bytes = b"") -> int | None:
        """The pid of the process holding this object when it is on this host (so
        large buffers may go through shared memory), else None. Asked once per
        endpoint with a mailbox ``H`` request (``prefix`` + request, e.g. a pipe's side)."""
        if shm.host_token() is None:
            return None
        if self._local is not None:
            return os.getpid()
        if self._shm_owner is False:
            try:
                owner = parse_owner(self.request(prefix + encode(MailboxOp.OWNER, 0)))
            except Exception:  # noqa: BLE001 - an owner that cannot tell: send bytes
                owner = None
            self._shm_owner = owner
        return self._shm_owner
