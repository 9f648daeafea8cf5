"""The mailbox of uber/fiber 0.2's ``SimpleQueuePush``: items pushed to its readers in
turn (round-robin), as uber/fiber's queue of that name pushed them over an nng PUSH
socket, rather than taken by whichever reader asks first.

A *reader* is a process that has called ``get()`` on the queue (its connection to the
owner's hub; the owner itself is one reader): it joins the turn at its first ``get()``,
as uber/fiber's reader connected at its first read. An item put while readers are known
is given to the next one in turn, and waits for that reader even if another is idle (a
reader that stops reading keeps its items: uber/fiber's "uneven load"); an item put
before any reader was known waits for the first reader that asks. Unlike uber/fiber,
whose pushed messages were lost with a reader that went away, a reader's unread items
go to the others, in turn (to whoever asks next when no reader is left): nothing is
dropped.
"""

from __future__ import annotations

import collections
import queue
import weakref
from collections.abc import Callable
from typing import Any

from fiber.runtime.mailbox import CLOSED, EMPTY, ITEM, Mailbox, _discard_all, _Waiter
from fiber.wire import transport
from fiber.wire.protocol import MailboxOp as Op

#: the reader key of the owner's own process (a remote reader's is its connection)
LOCAL = -1


def _discard_everything(items: collections.deque[bytes], putters: collections.deque[Any],
                        assigned: dict[int, collections.deque[bytes]]) -> None:
    _discard_all(items, putters, *assigned.values())


class PushMailbox(Mailbox):
    """A :class:`~fiber.runtime.mailbox.Mailbox` whose items go to its readers in turn
    (see the module's docstring). ``items`` holds those put before any reader was
    known; ``assigned`` each reader's own."""

    def __init__(self, hub: transport.Hub) -> None:
        super().__init__(hub, 0)
        self.readers: list[int] = []  # in the order they joined
        self.turn = 0  # the index in readers of the next item's reader
        self.assigned: dict[int, collections.deque[bytes]] = {}
        self.waiting: dict[int, collections.deque[_Waiter]] = {}
        # unread shared-memory items, the readers' own too, are unlinked when it goes
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _discard_everything, self.items,
                                           self._putters, self.assigned)
        self._finalizer.atexit = False

    def discard(self) -> None:
        with self.lock:
            _discard_all(self.items, *self.assigned.values())
            if self._watchers:
                self._changed()

    def _count(self) -> int:
        return len(self.items) + sum(len(items) for items in self.assigned.values())

    def watch(self, fn: Callable[[bool], None]) -> None:
        with self.lock:
            self._watchers.append(fn)
            fn(self._count() > 0 or self.closed)

    def _changed(self) -> None:
        readable = self._count() > 0 or self.closed
        for fn in self._watchers:
            fn(readable)

    def _join(self, reader: int) -> None:
        if reader not in self.assigned:
            self.readers.append(reader)
            self.assigned[reader] = collections.deque()
            self.waiting[reader] = collections.deque()

    def _admit(self, item: bytes) -> None:
        self.unfinished += 1
        self._wake_pollers()
        if not self.readers:
            if not self._deliver(item):  # (nobody can wait: a waiting reader is known)
                self.items.append(item)
        else:
            self._push(item)
        self.cond.notify_all()
        if self._watchers:
            self._changed()

    def _push(self, item: bytes) -> None:
        """Give ``item`` to the next reader in turn: to its waiting ``get()``, else to
        its own items."""
        self.turn %= len(self.readers)
        reader = self.readers[self.turn]
        self.turn += 1
        waiters = self.waiting[reader]
        while waiters:
            waiter = waiters.popleft()
            if waiter.done:
                continue
            waiter.done = True
            if waiter.request is None:
                waiter.result = item
                return
            left = self._reply_item(waiter.request, item, waiter.host)
            if left is None:
                return
            item = left  # that request is gone: the reader's next get() has it
        self.assigned[reader].append(item)

    def _next_for(self, reader: int) -> bytes | None:
        """The item ``reader`` reads next (those put before any reader came first)."""
        if self.items:
            return self.items.popleft()
        mine = self.assigned.get(reader)
        if mine:
            return mine.popleft()
        return None

    def get(self, block: bool = True, timeout: float | None = None) -> bytes:
        with self.lock:
            self._join(LOCAL)
            item = self._next_for(LOCAL)
            if item is not None:
                if self._watchers:
                    self._changed()
                return item
            if self.closed:
                raise EOFError(self.closed_reason)
            if not block or (timeout is not None and timeout <= 0):
                raise queue.Empty
            waiter = _Waiter(None)
            self.waiting[LOCAL].append(waiter)
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
                self.cond.wait_for(lambda: self._count() > 0 or self.closed, timeout)
            return self._count() > 0 or self.closed

    def close(self, reason: str = "") -> None:
        with self.lock:
            for waiters in self.waiting.values():
                self._getters.extend(waiters)  # answered CLOSED by the base's close
                waiters.clear()
            super().close(reason)

    def handle(self, request: transport.Request, op: bytes, timeout: float | None,
               data: memoryview) -> None:
        if op == Op.SIZE:
            with self.lock:
                request.reply(str(self._count()).encode())
            return
        if op == Op.POLL:
            with self.lock:
                ready = self._count() > 0 or self.closed
                if ready or timeout == 0:
                    request.reply(ITEM if ready else EMPTY)
                    return
            super().handle(request, op, timeout, data)  # parked until an item comes
            return
        if op != Op.GET:
            super().handle(request, op, timeout, data)
            return
        host = bytes(data)
        with self.lock:
            reader = request.peer
            self._join(reader)
            item = self._next_for(reader)
            if item is not None:
                left = self._reply_item(request, item, host)
                if left is not None:  # the reader is gone: keep the item for it
                    self.assigned[reader].appendleft(left)
                elif self._watchers:
                    self._changed()
            elif self.closed:
                request.reply(CLOSED + self.closed_reason.encode())
            elif timeout == 0:
                request.reply(EMPTY)
            else:
                waiter = _Waiter(request, host=host)
                self.waiting[reader].append(waiter)
                if timeout is not None:
                    self._deadline(timeout, waiter, request, EMPTY)

    def peer_gone(self, peer: int) -> None:
        """A reader went away: its unread items go to the others, in turn."""
        super().peer_gone(peer)
        with self.lock:
            if peer not in self.assigned:
                return
            left = self.assigned.pop(peer)
            del self.waiting[peer]
            index = self.readers.index(peer)
            self.readers.pop(index)
            if index < self.turn:
                self.turn -= 1
            for item in left:
                if self.readers:
                    self._push(item)
                else:
                    self.items.append(item)
            if left:
                self.cond.notify_all()
