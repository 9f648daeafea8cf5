"""``Queue``, ``JoinableQueue`` and ``SimpleQueue`` usable from any process of a run.

The queue's items live in a :class:`fiber.runtime.mailbox.Mailbox` in the process that created
it; every other process (on any machine) reaches it through the creator's hub. Several
writers and readers may use one queue at once; each item goes to exactly one reader.
Semantics follow multiprocessing (blocking, timeouts, ``queue.Empty``/``queue.Full``).
Differences: ``put`` returns once the item is in the owner's mailbox (there is no
feeder thread, so ``close``/``join_thread`` have nothing to wait for), ``qsize`` works
everywhere, and the queue lives as long as its creating process (a queue that was sent
to another process stays alive until the creator exits).

``q._reader`` is what multiprocessing's queues expose as their pipe's reading end, for
code that waits on it (``concurrent.futures.ProcessPoolExecutor`` passes it to
``multiprocessing.connection.wait`` and calls its ``recv()``): its ``fileno()`` is
readable while an item waits (:mod:`fiber.runtime.readiness`). A
``multiprocessing.queues.Queue`` (the executor's call queue is one, made with a fiber
context) pickled into a fiber job's arguments travels as a fiber queue fed by a thread
of this process from the standard queue (:func:`bridge_stdlib_queue`), since its pipe
cannot reach a job on another host.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from queue import Empty, Full  # raised by get and put, as multiprocessing.queues has them
from typing import Any, TypeVar

from fiber import threads, util
from fiber.errors import FiberThreadError
from fiber.runtime import arguments, popen_payload, readiness, run
from fiber.runtime.endpoint import Endpoint, fork_aware, keep_in_child
from fiber.runtime.mailbox import (
    ACCEPTED,
    CLOSED,
    EMPTY,
    FULL,
    ITEM,
    SHARED,
    Mailbox,
    decode,
    encode,
    reader_host,
)
from fiber.wire import auth, serialization, transport
from fiber.wire.protocol import MailboxOp as Op

logger = logging.getLogger("fiber")

__all__ = ["Queue", "JoinableQueue", "SimpleQueue", "Empty", "Full", "bridge_stdlib_queue"]


class QueueChannel:
    """The hub channel serving one mailbox."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        op, timeout, data = decode(payload)
        self.mailbox.handle(request, op, timeout, data)

    def peer_gone(self, peer: int) -> None:
        self.mailbox.peer_gone(peer)


_Q = TypeVar("_Q", bound="Queue")


def _rebuild(cls: type[_Q], address: str, cid: int, maxsize: int,
             secret: bytes | None = None) -> _Q:
    auth.adopt(secret)  # a child started by multiprocessing: the run's secret
    obj = cls.__new__(cls)
    obj._attach(address, cid, maxsize)
    return obj


class Queue:
    """A FIFO queue shared by processes, as :class:`multiprocessing.Queue`."""

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        maxsize = arguments.queue_maxsize(maxsize)  # as multiprocessing checks it
        # served on the hub its context's jobs reach (None: the default context's)
        hub = run.of(ctx).hub()
        # its items go with it; served on the stream wire too, for forked children
        cid = hub.add_channel(QueueChannel(self._new_mailbox(hub, maxsize)), stream=True)
        self._attach(hub.address, cid, maxsize)
        self._finalizer = weakref.finalize(self, hub.remove_channel, cid)
        self._finalizer.atexit = False  # children may use it until fiber's exit path

    @staticmethod
    def _new_mailbox(hub: transport.Hub, maxsize: int) -> Mailbox:
        return Mailbox(hub, maxsize)

    def _attach(self, address: str, cid: int, maxsize: int) -> None:
        self._maxsize = maxsize
        self._closed = False
        self._endpoint = Endpoint(address, cid)
        local = self._endpoint.local
        self._mailbox = local.mailbox if local is not None else None
        fork_aware(self)

    def _after_fork_in_child(self) -> None:
        self._mailbox = None  # a forked child reaches its parent's mailbox by the wire
        reader = self.__dict__.pop("_reader_obj", None)
        if reader is not None:
            keep_in_child(reader)  # its watcher belongs to the parent

    def __reduce__(self) -> tuple[Callable[..., Queue], tuple[Any, ...]]:
        finalizer = getattr(self, "_finalizer", None)
        if finalizer is not None:
            finalizer.detach()  # sent elsewhere: keep it for the creator's lifetime
        return (_rebuild, (type(self), self._endpoint.address, self._endpoint.cid,
                           self._maxsize, auth.for_stdlib_child()))

    def _check(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        self._check()
        data = serialization.dumps(obj, self._endpoint.shm_owner)
        try:
            self._put(data, block, timeout)
        except BaseException:
            serialization.discard(data)  # not accepted: its segment is still ours
            raise

    def _put(self, data: bytes, block: bool, timeout: float | None) -> None:
        wait = timeout if block else 0.0
        if self._mailbox is not None:
            self._mailbox.put(data, block, timeout)
            return
        op = Op.PUT_SHARED if isinstance(data, serialization.Shared) else Op.PUT
        reply = self._endpoint.request(encode(op, wait, data), wait)
        if reply[:1] == FULL:
            raise Full
        if reply[:1] != ACCEPTED:
            raise ValueError(f"Queue {self!r} cannot accept items ({reply[:1]!r})")

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self._check()
        wait = timeout if block else 0.0
        if self._mailbox is not None:
            return serialization.loads(self._mailbox.get(block, timeout))
        reply = self._endpoint.request(encode(Op.GET, wait, reader_host()), wait)
        kind = reply[:1]
        if kind == ITEM or kind == SHARED:
            return serialization.loads(memoryview(reply)[1:])
        if kind == EMPTY:
            raise Empty
        if kind == CLOSED:  # (after the kind: why, when a failure closed it)
            raise EOFError(bytes(reply[1:]).decode("utf-8", "replace"))
        raise ValueError(f"unexpected reply {kind!r}")

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        if self._mailbox is not None:
            return len(self._mailbox.items)
        return int(self._endpoint.request(encode(Op.SIZE, 0)))

    def empty(self) -> bool:
        return self.qsize() == 0

    def full(self) -> bool:
        return bool(self._maxsize) and self.qsize() >= self._maxsize

    def close(self) -> None:
        """This process will put no more items (as in multiprocessing)."""
        self._closed = True

    def join_thread(self) -> None:
        """Accepted for compatibility: ``put`` has already delivered every item."""
        if not self._closed:
            raise ValueError(f"Queue {self!r} not closed")

    def cancel_join_thread(self) -> None:
        """Accepted for compatibility (nothing to cancel)."""

    @property
    def _reader(self) -> QueueReader:
        """The reading side, as multiprocessing's queues have it (``fileno``,
        ``recv``, ``poll``)."""
        reader = self.__dict__.get("_reader_obj")
        if reader is None:
            reader = self.__dict__.setdefault("_reader_obj", QueueReader(self))
        return reader

    def __repr__(self) -> str:
        return f"<{type(self).__name__} at {self._endpoint.address}#{self._endpoint.cid}>"


class JoinableQueue(Queue):
    """A :class:`Queue` with ``task_done`` and ``join``."""

    def task_done(self) -> None:
        if self._mailbox is not None:
            self._mailbox.task_done()
        else:
            self._endpoint.request(encode(Op.TASK_DONE, 0))

    def join(self) -> None:
        if self._mailbox is not None:
            self._mailbox.join()
        else:
            self._endpoint.request(encode(Op.JOIN, None))


class SimpleQueue(Queue):
    """An unbounded queue with only ``get``, ``put``, ``empty`` and ``close``."""

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(0, ctx=ctx)


class SimpleQueuePush(SimpleQueue):
    """uber/fiber 0.2's ``SimpleQueuePush`` (deprecated: use :class:`SimpleQueue`): its
    items are pushed to its readers in turn, round-robin, as uber/fiber's were, rather
    than taken by whichever reader asks first (:mod:`fiber.runtime.push_mailbox`)."""

    def __init__(self, *, ctx: Any = None) -> None:
        util.warn_deprecated("fiber.queues.SimpleQueuePush",
                             "fiber.queues.SimpleQueuePush is deprecated: use fiber.SimpleQueue "
                             "(whose items go to whichever reader asks first)")
        super().__init__(ctx=ctx)

    @staticmethod
    def _new_mailbox(hub: transport.Hub, maxsize: int) -> Mailbox:
        from fiber.runtime.push_mailbox import PushMailbox  # (only uber's programs)

        return PushMailbox(hub)


class QueueReader:
    """``queue._reader``: a queue's reading side as a connection-like object whose
    ``fileno()`` is readable while an item waits (made on the first call)."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._watch: readiness.Watch | None = None
        self._lock = threading.Lock()

    def fileno(self) -> int:
        with self._lock:
            if self._watch is None:
                queue = self._queue
                if queue._mailbox is not None:
                    self._watch = readiness.LocalWatch(queue._mailbox)
                else:
                    endpoint = queue._endpoint
                    self._watch = readiness.RemoteWatch(endpoint.address, endpoint.cid,
                                                        b"", endpoint.request)
                weakref.finalize(self, self._watch.close).atexit = False
            return self._watch.fileno()

    def _check_watch(self) -> None:
        if self._watch is not None and self._watch.error is not None:
            raise self._watch.error

    def recv(self) -> Any:
        self._check_watch()
        item = self._queue.get()
        if self._watch is not None:
            self._watch.refresh()
        return item

    def poll(self, timeout: float | None = 0.0) -> bool:
        self._check_watch()
        if not self._queue.empty():
            return True
        if timeout is not None and timeout <= 0:
            return False
        from multiprocessing.connection import wait  # stdlib

        return bool(wait([self], timeout))  # type: ignore[list-item]  # has fileno()

    def close(self) -> None:
        with self._lock:
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.close()


class _StdlibQueueBridge(Queue):
    """A ``multiprocessing.queues.Queue`` as a fiber job receives it: items put into
    the standard queue in the process that sent it; ``put`` raises, since nobody would
    read it (the standard queue's readers read its pipe)."""

    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        raise ValueError(
            "this multiprocessing.Queue was sent to a fiber process, which can get items "
            "from it but not put any (its readers read an OS pipe of the process that "
            "made it): use a fiber Queue (import fiber as multiprocessing)")


_bridges: weakref.WeakKeyDictionary[Any, Queue] = weakref.WeakKeyDictionary()
_bridges_lock = threading.Lock()
_failed_bridges: weakref.WeakKeyDictionary[Any, FiberThreadError] = weakref.WeakKeyDictionary()


def bridge_stdlib_queue(std_queue: Any) -> tuple[Callable[..., Queue], tuple[Any, ...]]:
    """The reduction of a ``multiprocessing.queues.Queue`` pickled for a fiber job: a
    fiber queue of the same bound, fed from ``std_queue`` by a thread of this process
    (the same one for every job that gets it) until ``std_queue`` is closed."""
    with _bridges_lock:
        failed = _failed_bridges.get(std_queue)
        if failed is not None:
            raise failed
        bridge = _bridges.get(std_queue)
        if bridge is None:
            maxsize = getattr(std_queue, "_maxsize", 0)
            bridge = _bridges[std_queue] = _StdlibQueueBridge(maxsize if maxsize < 2**30 else 0)
            threads.start("fiber-stdlib-queue", _feed, std_queue, bridge,
                          fails=lambda error: _bridge_failed(std_queue, bridge, error))
    return bridge.__reduce__()


def _bridge_failed(std_queue: Any, bridge: Queue, error: FiberThreadError) -> None:
    """The feeding thread died: no item comes any more. The jobs given the queue see
    it closed, their ``get`` raising ``EOFError`` with ``error``'s message (naming the
    thread), and later jobs get ``error`` when the queue is sent."""
    with _bridges_lock:
        _failed_bridges[std_queue] = error
        _bridges.pop(std_queue, None)
    if bridge._mailbox is not None:
        bridge._mailbox.close(str(error))


def _feed(std_queue: Any, bridge: Queue) -> None:
    """Move the items of ``std_queue`` into ``bridge`` until every writer of its pipe
    is closed. Reads a descriptor of its own: the standard queue closes its reading
    end once its feeder thread has flushed the items put before ``close()``, which
    would otherwise lose those still in the pipe."""
    from multiprocessing.connection import Connection as PipeEnd  # stdlib
    from multiprocessing.reduction import ForkingPickler  # stdlib

    try:
        reader = PipeEnd(os.dup(std_queue._reader.fileno()), writable=False)
    except (OSError, TypeError, ValueError):  # closed already: nothing will come
        return
    with reader:
        while True:
            try:
                data = reader.recv_bytes()
            except (EOFError, OSError):  # every writer is closed
                return
            try:
                std_queue._sem.release()  # as the standard queue's get does
            except ValueError:
                pass
            try:
                Queue.put(bridge, ForkingPickler.loads(data))
            except Exception:  # noqa: BLE001 - this process is ending
                logger.debug("the bridge of a multiprocessing queue stops", exc_info=True)
                return


def _register() -> None:
    from multiprocessing import queues as std_queues  # stdlib

    popen_payload.register(std_queues.Queue, bridge_stdlib_queue)


_register()


# uber/fiber 0.2's names in this module (deprecated): name -> (module, name, new spelling)
_OLD_NAMES = {
    "Pipe": ("fiber.connection", "Pipe", "fiber.Pipe"),
    "ZConnection": ("fiber.connection", "Connection", "fiber.connection.Connection"),
    "SimpleQueuePull": ("fiber.queues", "SimpleQueue", "fiber.SimpleQueue"),
}


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        import importlib

        module, new_name, spelling = _OLD_NAMES[name]
        util.warn_deprecated(f"fiber.queues.{name}",
                             f"fiber.queues.{name} is deprecated: use {spelling}")
        return getattr(importlib.import_module(module), new_name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
