"""The broker behind queues and pipes: a FIFO of serialized items with parked
readers and writers, served to its own process directly and to other processes
through the hub.

A mailbox lives in the process that created the queue or pipe. Local callers block on
a condition variable; remote callers' requests are parked and answered when an item
(or room) arrives or when their timeout expires, the timeout being kept by the hub so
that an item is never both delivered and timed out.

Items whose large buffers are in a shared-memory segment (:class:`fiber.wire.serialization.
Shared`, put with op ``Q`` by remote senders) are handed to a remote reader of this
host as the descriptor (reply ``SHARED``), and to a reader of another host inline
(the segment read and unlinked here). Items that will never be read (the mailbox is
garbage collected, its reader end closed, a parked writer gone) have their segment
unlinked.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import weakref
from collections.abc import Callable

from fiber import util
from fiber.errors import FiberThreadError
from fiber.wire import serialization, shm, transport
from fiber.wire.protocol import MAILBOX_HEADER as _HEADER
from fiber.wire.protocol import MailboxOp as Op
from fiber.wire.protocol import MailboxReply
from fiber.wire.serialization import Shared

HEADER_SIZE = _HEADER.size

# reply kinds
ITEM = MailboxReply.ITEM
EMPTY = MailboxReply.EMPTY
ACCEPTED = MailboxReply.ACCEPTED
FULL = MailboxReply.FULL
CLOSED = MailboxReply.CLOSED
SHARED = MailboxReply.SHARED


def reader_host() -> bytes:
    """The data of a ``G`` request: the reader's host token (empty: no shared memory)."""
    return shm.host_token() or b""


def owner_answer() -> bytes:
    """The reply to ``H``: this process's pid and host token, when shared memory works."""
    token = shm.host_token()
    return b"" if token is None else b"%d\n%s" % (os.getpid(), token)


def parse_owner(reply: bytes) -> int | None:
    """The mailbox owner's pid from an ``H`` reply when it shares this host's memory."""
    pid, _, token = bytes(reply).partition(b"\n")
    if not token or token != shm.host_token():
        return None
    return int(pid)


def _discard_all(*queues) -> None:
    for items in queues:
        for item in list(items):
            if isinstance(item, _Waiter):  # a parked writer's item (unless timed out)
                item = None if item.done else item.item
            if isinstance(item, Shared):
                serialization.discard(item)
        items.clear()


def encode(op: bytes, timeout: float | None, data: bytes = b"") -> bytes:
    return _HEADER.pack(op, -1.0 if timeout is None else max(0.0, timeout)) + data


def decode(payload: memoryview) -> tuple[bytes, float | None, memoryview]:
    """The op, timeout (None: forever) and data of a request; :class:`ValueError` for
    a payload shorter than the header (a malformed request)."""
    if len(payload) < HEADER_SIZE:
        raise ValueError("a mailbox request shorter than its header")
    op, timeout = _HEADER.unpack_from(payload)
    return op, (None if timeout < 0 else timeout), payload[HEADER_SIZE:]


_mailboxes: weakref.WeakSet = weakref.WeakSet()


def _drop_all() -> None:
    """At the main process's exit: the items of its mailboxes will never be read."""
    for mailbox in list(_mailboxes):
        mailbox._finalizer()


class _Waiter:
    __slots__ = ("request", "item", "done", "result", "host")

    def __init__(self, request: transport.Request | None, item: bytes = b"",
                 host: bytes = b"") -> None:
        self.request = request  # None: a caller of this process, waiting on the condition
        self.item = item  # a parked writer's item
        self.host = host  # a remote reader's host token
        self.done = False
        self.result: bytes | None = None


class Mailbox:
    """A FIFO with optional bound ``maxsize`` (0: unbounded)."""

    def __init__(self, hub: transport.Hub, maxsize: int = 0) -> None:
        self.hub = hub
        self.maxsize = maxsize
        self.items: collections.deque[bytes] = collections.deque()
        self._getters: collections.deque[_Waiter] = collections.deque()
        self._putters: collections.deque[_Waiter] = collections.deque()
        self._pollers: list[_Waiter] = []
        self.closed = False  # no more items will come (the writing end is closed)
        self.closed_reason = ""  # why, when a failure closed it (see close())
        self.reader_closed = False  # nobody will read: writers get BrokenPipeError
        self.unfinished = 0  # JoinableQueue
        self._joiners: list[_Waiter] = []
        # told whether something can be read after every change (readiness descriptors)
        self._watchers: list[Callable[[bool], None]] = []
        # reentrant: a pipe end collected on this thread closes its side from a finalizer
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        # unread shared-memory items are unlinked when the mailbox goes
        self._finalizer = weakref.finalize(self, _discard_all, self.items, self._putters)
        # not at interpreter exit: weakref's exit hook may run before fiber's exit path
        # has joined the children that still read this mailbox (_drop_all runs after)
        self._finalizer.atexit = False
        if not _mailboxes:
            util.at_exit("mailboxes", util.MAILBOXES, _drop_all)
        _mailboxes.add(self)

    def discard(self) -> None:
        """Nobody will read this mailbox: drop its items (and their segments)."""
        with self.lock:
            _discard_all(self.items)
            if self._watchers:
                self._changed()

    def watch(self, fn: Callable[[bool], None]) -> None:
        """Call ``fn(readable)`` now and, under the lock, whenever whether an item can
        be read (or EOF) changes (:mod:`fiber.runtime.readiness`)."""
        with self.lock:
            self._watchers.append(fn)
            fn(bool(self.items) or self.closed)

    def unwatch(self, fn: Callable[[bool], None]) -> None:
        with self.lock:
            if fn in self._watchers:
                self._watchers.remove(fn)

    def _changed(self) -> None:
        readable = bool(self.items) or self.closed
        for fn in self._watchers:
            fn(readable)

    @staticmethod
    def _reply_item(request: transport.Request, item: bytes, host: bytes) -> bytes | None:
        """Answer a remote reader with ``item``; None when delivered, else the item to
        keep (inlined if it was shared: its segment is gone)."""
        if isinstance(item, Shared):
            if host and host == shm.host_token():
                return None if request.reply(SHARED + item) else item
            item = serialization.inline(item)
        return None if request.reply(ITEM + item) else item

    # -- shared logic (lock held) ---------------------------------------------------
    def _deliver(self, item: bytes) -> bool:
        """Give ``item`` to the first live getter; False when nobody waits."""
        while self._getters:
            waiter = self._getters.popleft()
            if waiter.done:
                continue
            waiter.done = True
            if waiter.request is not None:
                left = self._reply_item(waiter.request, item, waiter.host)
                if left is None:
                    return True
                item = left
                continue  # that requester is gone: try the next one
            waiter.result = item
            self.cond.notify_all()
            return True
        return False

    def _admit(self, item: bytes) -> None:
        self.unfinished += 1
        self._wake_pollers()
        if not self._deliver(item):
            self.items.append(item)
            self.cond.notify_all()  # a local poll(timeout) waits on the condition
            if self._watchers:
                self._changed()

    def _wake_pollers(self) -> None:
        pollers, self._pollers = self._pollers, []
        for waiter in pollers:
            if not waiter.done:
                waiter.done = True
                assert waiter.request is not None  # local callers poll on the condition
                waiter.request.reply(ITEM)

    def _take(self) -> bytes:
        item = self.items.popleft()
        if self._watchers:
            self._changed()
        while self._putters and (not self.maxsize or len(self.items) < self.maxsize):
            waiter = self._putters.popleft()
            if waiter.done:
                continue
            waiter.done = True
            self._admit(waiter.item)
            if waiter.request is not None:
                waiter.request.reply(ACCEPTED)
            else:
                self.cond.notify_all()
        return item

    def _full(self) -> bool:
        return bool(self.maxsize) and len(self.items) >= self.maxsize

    def _deadline(self, timeout: float, waiter: _Waiter, request: transport.Request,
                  reply: bytes) -> None:
        """Answer ``reply`` to ``waiter``'s ``request`` in ``timeout`` seconds unless
        answered before; if the hub's timer thread has died, or dies meanwhile, the
        request fails with its error (the caller's get/put raises it: a timeout that
        cannot be kept is never an answer that comes late or never)."""
        try:
            self.hub.call_later(timeout, lambda: self._expire(waiter, request, reply),
                                lambda error: self._fail(waiter, request, error))
        except FiberThreadError as error:
            self._fail(waiter, request, error)

    def _fail(self, waiter: _Waiter, request: transport.Request,
              error: FiberThreadError) -> None:
        with self.lock:
            if waiter.done:
                return
            waiter.done = True
        request.reply(serialization.pack_exception(error), transport.ERROR)

    def _expire(self, waiter: _Waiter, request: transport.Request, reply: bytes) -> None:
        with self.lock:
            if waiter.done:
                return
            waiter.done = True
        request.reply(reply)

    # -- local callers --------------------------------------------------------------
    def put(self, item: bytes, block: bool = True, timeout: float | None = None) -> None:
        with self.lock:
            if self.reader_closed:
                raise BrokenPipeError("the other end of the pipe is closed")
            if not self._full():
                self._admit(item)
                return
            if not block or (timeout is not None and timeout <= 0):
                raise queue.Full
            waiter = _Waiter(None, item)
            self._putters.append(waiter)
            if not self.cond.wait_for(lambda: waiter.done, timeout):
                waiter.done = True
                raise queue.Full

    def get(self, block: bool = True, timeout: float | None = None) -> bytes:
        with self.lock:
            if self.items:
                return self._take()
            if self.closed:
                raise EOFError(self.closed_reason)
            if not block or (timeout is not None and timeout <= 0):
                raise queue.Empty
            waiter = _Waiter(None)
            self._getters.append(waiter)
            if not self.cond.wait_for(lambda: waiter.done or self.closed, timeout) \
                    or waiter.result is None:
                waiter.done = True
                if self.closed:
                    raise EOFError(self.closed_reason)
                raise queue.Empty
            return waiter.result

    def poll(self, timeout: float | None = 0.0) -> bool:
        with self.lock:
            if timeout is None or timeout > 0:
                self.cond.wait_for(lambda: self.items or self.closed, timeout)
            return bool(self.items) or self.closed

    def close(self, reason: str = "") -> None:
        """No more items will come: readers of an empty mailbox get EOF (an
        ``EOFError`` whose message is ``reason``, say a dead feeding thread's error;
        a remote reader gets it after the ``CLOSED`` reply's kind)."""
        with self.lock:
            self.closed = True
            self.closed_reason = reason
            self._wake_pollers()
            if self._watchers:
                self._changed()
            getters, self._getters = list(self._getters), collections.deque()
            for waiter in getters:
                if not waiter.done:
                    waiter.done = True
                    if waiter.request is not None:
                        waiter.request.reply(CLOSED + reason.encode())
            self.cond.notify_all()

    def task_done(self) -> None:
        with self.lock:
            self._task_done()

    def _task_done(self) -> None:
        if self.unfinished <= 0:
            raise ValueError("task_done() called too many times")
        self.unfinished -= 1
        if self.unfinished == 0:
            joiners, self._joiners = self._joiners, []
            for waiter in joiners:
                assert waiter.request is not None  # local callers join on the condition
                waiter.request.reply(b"")
            self.cond.notify_all()

    def join(self) -> None:
        with self.lock:
            self.cond.wait_for(lambda: self.unfinished == 0)

    # -- remote callers (hub thread) ------------------------------------------------
    def handle(self, request: transport.Request, op: bytes, timeout: float | None,
               data: memoryview) -> None:
        with self.lock:
            if op == Op.GET:
                host = bytes(data)
                if self.items:
                    item = self._take()
                    left = self._reply_item(request, item, host)
                    if left is not None:  # the reader is gone: keep the item
                        self.items.appendleft(left)
                        if self._watchers:
                            self._changed()
                elif self.closed:
                    request.reply(CLOSED + self.closed_reason.encode())
                elif timeout == 0:
                    request.reply(EMPTY)
                else:
                    waiter = _Waiter(request, host=host)
                    self._getters.append(waiter)
                    if timeout is not None:
                        self._deadline(timeout, waiter, request, EMPTY)
            elif op == Op.PUT or op == Op.PUT_SHARED:  # Q: the item is shared (a descriptor)
                item = Shared(data) if op == Op.PUT_SHARED else bytes(data)
                if self.reader_closed:
                    request.reply(CLOSED)
                elif not self._full():
                    self._admit(item)
                    request.reply(ACCEPTED)
                elif timeout == 0:
                    request.reply(FULL)
                else:
                    waiter = _Waiter(request, item)
                    self._putters.append(waiter)
                    if timeout is not None:
                        self._deadline(timeout, waiter, request, FULL)
            elif op == Op.POLL:  # poll: is there something to read?
                if self.items or self.closed or timeout == 0:
                    request.reply(ITEM if (self.items or self.closed) else EMPTY)
                else:
                    waiter = _Waiter(request)
                    self._pollers.append(waiter)  # polls do not take items
                    if timeout is not None:
                        self._deadline(timeout, waiter, request, EMPTY)
            elif op == Op.SIZE:
                request.reply(str(len(self.items)).encode())
            elif op == Op.OWNER:  # may the writer put shared-memory items?
                request.reply(owner_answer())
            elif op == Op.TASK_DONE:
                try:
                    self._task_done()
                except ValueError as exc:
                    request.reply(serialization.pack_exception(exc), transport.ERROR)
                    return
                request.reply(b"")
            elif op == Op.JOIN:
                if self.unfinished == 0:
                    request.reply(b"")
                else:
                    self._joiners.append(_Waiter(request))
            else:
                request.reply(b"unknown mailbox request", transport.ERROR)

    def peer_gone(self, peer: int) -> None:
        with self.lock:
            for waiters in (self._getters, self._putters, self._pollers, self._joiners):
                for waiter in waiters:
                    if waiter.request is not None and waiter.request.peer == peer:
                        if not waiter.done and isinstance(waiter.item, Shared):
                            serialization.discard(waiter.item)  # never admitted
                        waiter.done = True
