"""Synchronization primitives shared by the processes of a run, as
:mod:`multiprocessing.synchronize`: :class:`Lock`, :class:`RLock`, :class:`Semaphore`,
:class:`BoundedSemaphore`, :class:`Condition`, :class:`Event` and :class:`Barrier`,
with multiprocessing's constructors, methods, semantics and reprs.

**Two paths, chosen per process.** A primitive is made of POSIX named semaphores
(``_multiprocessing.SemLock``, the kernel object multiprocessing uses) and, for a
Barrier, a few integers of shared memory, all named after the process that created it
(:func:`fiber.wire.shm.state_name`). A process of the creator's host (same kernel,
same ``/dev/shm``, same pid namespace: :func:`fiber.wire.shm.host_token`) that
receives the primitive opens the same semaphores by name and uses them natively: an
uncontended ``acquire()``/``release()`` costs what it costs in multiprocessing, a few
hundred nanoseconds. A process of another host (another container, node or pod), or
one whose ``shared_memory`` setting is off, receives a proxy of the creator's object
instead (:mod:`fiber.runtime.shared.served`): the same methods, each one network round
trip to the creator (tens to hundreds of microseconds), served there by a thread per
calling thread, so that a lock or a condition owned by a remote thread stays owned by
it. :func:`_path` tells which of the two an object took.

**Differences from multiprocessing**, and why:

* a primitive pickles at any time (into a Queue, a Pipe, a Pool task), not only while
  a child process is being started: fiber's children may live on other hosts, and the
  proxy path makes any route work;
* its names are unlinked when the creator collects it or exits (after joining its
  children); a process that receives one after that gets an error naming the cause,
  and a holder on another host gets :class:`fiber.ConnectionLostError` at its next
  operation once the creator is gone. Holders on the creator's host keep the
  semaphores they opened. A creator keeps every primitive it has pickled until it
  exits (a pickle in flight cannot be counted);
* a holder on another host has a proxy (``AcquirerProxy``, ``ConditionProxy``...), not
  an instance of these classes.
"""

from __future__ import annotations

import _multiprocessing
import pickle
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from fiber import util
from fiber.runtime.shared import served
from fiber.runtime.shared.buffers import SharedBuffer
from fiber.wire import shm

__all__ = ["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event",
           "Barrier"]

RECURSIVE_MUTEX, SEMAPHORE = 0, 1  # the kinds of _multiprocessing.SemLock
SEM_VALUE_MAX: int = _multiprocessing.SemLock.SEM_VALUE_MAX

_names_lock = threading.Lock()
_created: set[str] = set()  # semaphore names this process created and has not unlinked


def _unlink(name: str) -> None:
    with _names_lock:
        if name not in _created:
            return
        _created.discard(name)
    try:
        _multiprocessing.sem_unlink(name)
    except OSError:
        pass


def _unlink_all() -> None:
    """At exit, after the children were joined: the names of this process's
    semaphores go (processes that opened them keep them)."""
    with _names_lock:
        names = list(_created)
    for name in names:
        _unlink(name)


def _thread_label() -> str:
    from fiber.process import current_process  # an API module of the same layer

    name = current_process().name
    thread = threading.current_thread().name
    return name if thread == "MainThread" else f"{name}|{thread}"


def _path(obj: Any) -> str:
    """How this process uses ``obj``: ``"native"`` (shared memory of this host) or
    ``"creator"`` (a proxy: each operation a round trip to its creator). For tests."""
    return "native" if isinstance(obj, (SemLock, Condition, Event, Barrier)) else "creator"


def _dumps(state: tuple) -> bytes:
    try:
        return pickle.dumps(state, 5)
    except Exception:  # noqa: BLE001 - e.g. a Barrier's action is a lambda
        import cloudpickle

        return cloudpickle.dumps(state, 5)


class _Shared:
    """What every primitive shares: pickling by name on the creator's host, as a
    proxy of the creator's object elsewhere."""

    _typeid = ""
    _host: bytes | None
    _token: Any = None

    def _state(self) -> tuple:
        raise NotImplementedError

    def _set_state(self, state: tuple) -> None:
        raise NotImplementedError

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        token = self._token
        if token is None:  # this process created it: serve it to other hosts
            token = self._token = served.token_for(self, self._typeid)
        # the state goes as a nested pickle: another host never unpickles it (which
        # would make proxies of the parts for nothing)
        return (_rebuild, (type(self), _dumps(self._state()), self._host, token))


def _rebuild(cls: type[_Shared], state: bytes, host: bytes | None, token: Any) -> Any:
    if host is not None and host == shm.host_token():
        obj = cls.__new__(cls)
        obj._host, obj._token = host, token
        obj._set_state(pickle.loads(state))
        return obj
    return served.proxy_of(token)


class SemLock(_Shared):
    """A semaphore of the kernel, named; the base of the locks and semaphores."""

    def __init__(self, kind: int, value: int, maxvalue: int, *, ctx: Any = None) -> None:
        name = "/" + shm.state_name()
        self._semlock = _multiprocessing.SemLock(kind, value, maxvalue, name, False)
        with _names_lock:
            _created.add(name)
        util.at_exit("shared semaphores", util.SHARED_STATE, _unlink_all)
        # at exit, _unlink_all does it after the children were joined
        weakref.finalize(self, _unlink, name).atexit = False
        self._host = shm.host_token()
        self._bind()

    def _bind(self) -> None:
        # straight to the C methods, as multiprocessing does: no Python frame per call
        self.acquire = self._semlock.acquire
        self.release = self._semlock.release

    def __enter__(self) -> bool:
        return self._semlock.__enter__()

    def __exit__(self, *args: object) -> None:
        self._semlock.__exit__(*args)

    def _state(self) -> tuple:
        sl = self._semlock
        return (sl.kind, sl.maxvalue, sl.name)

    def _set_state(self, state: tuple) -> None:
        kind, maxvalue, name = state
        try:
            self._semlock = _multiprocessing.SemLock._rebuild(0, kind, maxvalue, name)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"the semaphore {name} is gone: the process that created this "
                f"{type(self).__name__} has exited (a primitive must be used while its "
                "creator runs)") from None
        self._bind()


class Semaphore(SemLock):
    """A counting semaphore (``multiprocessing.Semaphore``)."""

    _typeid = "Semaphore"

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        super().__init__(SEMAPHORE, value, SEM_VALUE_MAX, ctx=ctx)

    def get_value(self) -> int:
        return self._semlock._get_value()

    def __repr__(self) -> str:
        try:
            value: object = self._semlock._get_value()
        except Exception:  # noqa: BLE001 - as multiprocessing: a repr never raises
            value = "unknown"
        return f"<{type(self).__name__}(value={value})>"


class BoundedSemaphore(Semaphore):
    """A semaphore that cannot be released above its initial value."""

    _typeid = "BoundedSemaphore"

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        SemLock.__init__(self, SEMAPHORE, value, value, ctx=ctx)

    def __repr__(self) -> str:
        try:
            value: object = self._semlock._get_value()
        except Exception:  # noqa: BLE001
            value = "unknown"
        return (f"<{type(self).__name__}(value={value}, "
                f"maxvalue={self._semlock.maxvalue})>")


class Lock(SemLock):
    """A non-recursive lock (``multiprocessing.Lock``)."""

    _typeid = "Lock"

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(SEMAPHORE, 1, 1, ctx=ctx)

    def __repr__(self) -> str:
        try:
            sl = self._semlock
            if sl._is_mine():
                owner = _thread_label()
            elif sl._get_value() == 1:
                owner = "None"
            elif sl._count() > 0:
                owner = "SomeOtherThread"
            else:
                owner = "SomeOtherProcess"
        except Exception:  # noqa: BLE001
            owner = "unknown"
        return f"<{type(self).__name__}(owner={owner})>"


class RLock(SemLock):
    """A recursive lock (``multiprocessing.RLock``): its owner may acquire it again."""

    _typeid = "RLock"

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(RECURSIVE_MUTEX, 1, 1, ctx=ctx)

    def __repr__(self) -> str:
        try:
            sl = self._semlock
            count: object
            if sl._is_mine():
                owner, count = _thread_label(), sl._count()
            elif sl._get_value() == 1:
                owner, count = "None", 0
            elif sl._count() > 0:
                owner, count = "SomeOtherThread", "nonzero"
            else:
                owner, count = "SomeOtherProcess", "nonzero"
        except Exception:  # noqa: BLE001
            owner, count = "unknown", "unknown"
        return f"<{type(self).__name__}({owner}, {count})>"


class Condition(_Shared):
    """A condition variable (``multiprocessing.Condition``); its lock is an
    :class:`RLock` unless one is given."""

    _typeid = "Condition"

    def __init__(self, lock: Lock | RLock | None = None, *, ctx: Any = None) -> None:
        self._lock = lock if lock is not None else RLock()
        self._sleeping_count = Semaphore(0)  # waiters that went to sleep
        self._woken_count = Semaphore(0)     # waiters that woke (notified or timed out)
        self._wait_semaphore = Semaphore(0)  # what a notify gives a sleeper
        self._host = shm.host_token()
        self._bind()

    def _bind(self) -> None:
        self.acquire = self._lock.acquire
        self.release = self._lock.release

    def _state(self) -> tuple:
        return (self._lock, self._sleeping_count, self._woken_count, self._wait_semaphore)

    def _set_state(self, state: tuple) -> None:
        (self._lock, self._sleeping_count, self._woken_count,
         self._wait_semaphore) = state
        self._bind()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *args: object) -> None:
        self._lock.__exit__(*args)

    def __repr__(self) -> str:
        try:
            waiters: object = (self._sleeping_count._semlock._get_value()
                               - self._woken_count._semlock._get_value())
        except Exception:  # noqa: BLE001
            waiters = "unknown"
        return f"<{type(self).__name__}({self._lock}, {waiters})>"

    def _owned(self) -> bool:
        return bool(self._lock._semlock._is_mine())

    def wait(self, timeout: float | None = None) -> bool:
        assert self._owned(), "must acquire() condition before using wait()"
        self._sleeping_count.release()
        # give the lock up completely (an RLock may be held several times)
        depth = self._lock._semlock._count()
        for _ in range(depth):
            self._lock.release()
        try:
            return bool(self._wait_semaphore.acquire(True, timeout))
        finally:
            self._woken_count.release()
            for _ in range(depth):
                self._lock.acquire()

    def notify(self, n: int = 1) -> None:
        assert self._owned(), "lock is not owned"
        assert not self._wait_semaphore.acquire(False)
        # waiters that timed out since the last notify woke without a notification:
        # take them off the sleepers
        while self._woken_count.acquire(False):
            taken = self._sleeping_count.acquire(False)
            assert taken, "notify: a waiter woke that never slept"
        woken = 0
        while woken < n and self._sleeping_count.acquire(False):
            self._wait_semaphore.release()
            woken += 1
        if woken:
            for _ in range(woken):
                self._woken_count.acquire()  # until each of them is awake
            # a waiter that timed out meanwhile left its notification unused
            while self._wait_semaphore.acquire(False):
                pass

    def notify_all(self) -> None:
        self.notify(sys.maxsize)

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        result = predicate()
        if result:
            return result
        deadline = None if timeout is None else time.monotonic() + timeout
        while not result:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.wait(left)
            else:
                self.wait()
            result = predicate()
        return result


class Event(_Shared):
    """An event flag (``multiprocessing.Event``)."""

    _typeid = "Event"

    def __init__(self, *, ctx: Any = None) -> None:
        self._cond = Condition(Lock())
        self._flag = Semaphore(0)
        self._host = shm.host_token()

    def _state(self) -> tuple:
        return (self._cond, self._flag)

    def _set_state(self, state: tuple) -> None:
        self._cond, self._flag = state

    def is_set(self) -> bool:
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

    def set(self) -> None:
        with self._cond:
            self._flag.acquire(False)
            self._flag.release()
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._flag.acquire(False)

    def wait(self, timeout: float | None = None) -> bool:
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
            else:
                self._cond.wait(timeout)
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} at {id(self):#x} " \
               f"{'set' if self.is_set() else 'unset'}>"


_INTS = struct.Struct("ii")  # a Barrier's state and count


class Barrier(_Shared, threading.Barrier):
    """A barrier (``multiprocessing.Barrier``): :class:`threading.Barrier`'s logic
    over a shared :class:`Condition` and two shared integers."""

    _typeid = "Barrier"

    def __init__(self, parties: int, action: Callable[[], object] | None = None,
                 timeout: float | None = None, *, ctx: Any = None) -> None:
        self._buffer = SharedBuffer(_INTS.size)  # the creator's: collected, it unlinks
        self._set_state((parties, action, timeout, Condition(), self._buffer.name))
        self._state = 0
        self._count = 0
        self._host = shm.host_token()

    # threading.Barrier keeps _state and _count as attributes; here they are two
    # integers of shared memory (properties below), so the pickled state is
    # _state_tuple(), not _Shared's _state()
    def _state_tuple(self) -> tuple:
        return (self._parties, self._action, self._timeout, self._cond,
                self._buffer.name)

    def _set_state(self, state: tuple) -> None:
        self._parties, self._action, self._timeout, self._cond, name = state
        if getattr(self, "_buffer", None) is None:
            self._buffer = SharedBuffer.attach(name, _INTS.size)
        self._ints = memoryview(self._buffer.map).cast("i")

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        token = self._token
        if token is None:
            token = self._token = served.token_for(self, self._typeid)
        return (_rebuild, (type(self), _dumps(self._state_tuple()), self._host, token))

    @property  # type: ignore[override]
    def _state(self) -> int:
        return self._ints[0]

    @_state.setter
    def _state(self, value: int) -> None:
        self._ints[0] = value

    @property
    def _count(self) -> int:
        return self._ints[1]

    @_count.setter
    def _count(self, value: int) -> None:
        self._ints[1] = value

    def __repr__(self) -> str:
        if self.broken:
            return f"<{type(self).__module__}.{type(self).__qualname__} at {id(self):#x}: broken>"
        return (f"<{type(self).__module__}.{type(self).__qualname__} at {id(self):#x}: "
                f"waiters={self.n_waiting}/{self.parties}>")

