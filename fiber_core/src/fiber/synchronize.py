"""Synchronization primitives shared by the processes of a run, as
:mod:`multiprocessing.synchronize`: :class:`Lock`, :class:`RLock`, :class:`Semaphore`,
:class:`BoundedSemaphore`, :class:`Condition`, :class:`Event` and :class:`Barrier`
(``fiber.Lock()``, ``ctx.Lock()``... make them), with multiprocessing's methods,
semantics and reprs.

**Native on one host.** A primitive is made of POSIX named semaphores
(``_multiprocessing.SemLock``, the C type multiprocessing uses, named
``"/" + fiber.wire.shm.state_name()``) and, for a :class:`Barrier`, a small block of
shared memory (:class:`~fiber.runtime.shared.buffers.SharedBuffer`). A process of the
creator's host that receives one (pickled into a Process's arguments, a Pool task, a
Queue or a Pipe: at any time, not only while spawning) reopens the semaphores by
name: its operations are the C calls multiprocessing makes (an uncontended
acquire+release costs what it costs there).

**Through the creator elsewhere.** A process of another host (another container, node
or pod), or one whose ``shared_memory`` setting is false, cannot open them: it gets a
proxy of the creator's object instead (:mod:`fiber.runtime.shared.served`), whose every
operation is one round trip to the creator, run there by a thread that serves that
proxy's thread (so an ``RLock`` or a ``Condition`` acquired through a proxy is owned by
the caller's thread, as natively). Same methods and results; the proxy is not an
instance of the class, and a :class:`Barrier`'s ``action`` runs in the process of the
last party to arrive, which for a proxy is the creator. A process that holds a proxy
after its creator is gone gets :class:`fiber.ConnectionLostError` at its next operation.

**Lifetime.** The creator unlinks the names when the object is garbage collected in it
(if it was never pickled) or at its exit, after its children have been joined
(:data:`fiber.util.SHARED_STATE`); a process that opened them keeps using them; what
killed creators leave behind is swept (:func:`fiber.wire.shm.sweep`). Opening a
primitive whose creator has exited raises :class:`FileNotFoundError` saying so.

**No named semaphores** (``/dev/shm`` missing or read-only): a primitive is then made
over :mod:`threading` in its creator (one warning in the log) and every other process
uses it through the creator. The names, their lifetime and this fallback are in
:mod:`fiber.runtime.shared.semaphores`; what a pickle carries and the proxies, in
:mod:`fiber.runtime.shared.sync_proxies`.

Of ``_multiprocessing.SemLock``, a private type of CPython, this module uses the
methods ``acquire``, ``release``, ``_is_mine``, ``_count``, ``_get_value``,
``_is_zero``, as :mod:`multiprocessing.synchronize` does.
``ctx`` (``ctx.Lock()`` passes it) is accepted and not used: a primitive is shared
memory of its creator's host whatever the context, and its creator serves it to other
hosts from one server per process, at the default target's address
(:mod:`fiber.runtime.shared.served`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from fiber.runtime.managers.stdlib import BaseProxy
from fiber.runtime.shared import served, sync_proxies
from fiber.runtime.shared.buffers import SharedBuffer
from fiber.runtime.shared.semaphores import (
    RECURSIVE_MUTEX,
    SEM_VALUE_MAX,
    SEMAPHORE,
    new_semlock,
    reopen,
    unlink_name,
)
from fiber.wire import auth

__all__ = ["Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event",
           "Barrier"]  # and, as in multiprocessing.synchronize: SemLock, SEM_VALUE_MAX,
#                       RECURSIVE_MUTEX, SEMAPHORE

logger = logging.getLogger("fiber.synchronize")


def _me() -> str:
    """The caller as multiprocessing's reprs name an owner."""
    from fiber.process import current_process  # loaded when a repr needs it
    name = current_process().name
    thread = threading.current_thread().name
    return name if thread == "MainThread" else f"{name}|{thread}"


# -- pickling: native on the creator's host, through the creator elsewhere --------------
def _reduce(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    host, token = sync_proxies.token_of(obj)
    state = obj._native_state() if host is not None else None
    return _rebuild, (type(obj).__name__, state, host, token, auth.for_stdlib_child())


def _rebuild(cls_name: str, state: Any, host: bytes | None, token: Any,
             secret: bytes | None = None) -> Any:
    """Unpickle a primitive: the creator's own object in its creator, a native object
    over the same semaphores on its host, else a proxy of it. ``secret``: the run's, for
    a child started by multiprocessing (:func:`fiber.wire.auth.for_stdlib_child`)."""
    auth.adopt(secret)
    obj = sync_proxies.served_object(token)
    if obj is not None:
        return obj
    if state is not None and host is not None and host == sync_proxies.host():
        obj = _CLASSES[cls_name]._attach(state)
        obj._origin = (host, token)
        return obj
    proxy = served.proxy_of(token)
    proxy._fiber_state = (cls_name, state, host)
    return proxy


def shared_path(obj: Any) -> str:
    """fiber extension: which path the primitive ``obj`` takes in this process:
    ``"native"`` (this process uses the semaphores itself) or ``"creator"`` (a proxy:
    each operation goes through the process that created it). The same question
    :func:`fiber.sharedctypes.shared_path` answers for shared values; tests and
    diagnostics ask it."""
    return "creator" if isinstance(obj, BaseProxy) else "native"


# -- the primitives -------------------------------------------------------------------
class SemLock:
    """The base of the semaphores and locks: a ``_multiprocessing.SemLock``, whose
    ``acquire(block=True, timeout=None)`` and ``release()`` are this object's."""

    _typeid = "Lock"
    _what = "lock"

    def __init__(self, kind: int, value: int, maxvalue: int, *, ctx: Any = None) -> None:
        self._semlock = new_semlock(kind, value, maxvalue)
        self._make_methods()
        name = self._semlock.name
        if name is not None:  # unlinked when collected here, or at exit
            weakref.finalize(self, unlink_name, name).atexit = False

    def _make_methods(self) -> None:
        self.acquire = self._semlock.acquire
        self.release = self._semlock.release

    def __enter__(self) -> bool:
        return self._semlock.__enter__()

    def __exit__(self, *args: object) -> None:
        return self._semlock.__exit__(*args)

    def _native_state(self) -> tuple[Any, ...] | None:
        sl = self._semlock
        return None if sl.name is None else (sl.kind, sl.maxvalue, sl.name)

    @classmethod
    def _attach(cls, state: tuple[Any, ...]) -> Any:
        self = cls.__new__(cls)
        kind, maxvalue, name = state
        self._semlock = reopen(kind, maxvalue, name, cls._what)
        self._make_methods()
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self)

    def _owner(self, me: str) -> tuple[str, Any]:
        """Who holds it, as multiprocessing's reprs say, and its recursion count."""
        sl = self._semlock
        try:
            if sl._is_mine():
                return me, sl._count()
            if not sl._is_zero():
                return "None", 0
            if sl._count() > 0:
                return "SomeOtherThread", "nonzero"
            return "SomeOtherProcess", "nonzero"
        except Exception:  # noqa: BLE001 - a repr never fails, as multiprocessing's
            return "unknown", "unknown"

    def _describe(self, me: str) -> str:
        return f"<{type(self).__name__}(owner={self._owner(me)[0]})>"

    def __repr__(self) -> str:
        return self._describe(_me())


class Semaphore(SemLock):
    """A semaphore: ``acquire`` blocks while its value is 0; ``get_value()``."""

    _typeid = "Semaphore"
    _what = "semaphore"

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        SemLock.__init__(self, SEMAPHORE, value, SEM_VALUE_MAX)

    def get_value(self) -> int:
        """The semaphore's value."""
        return self._semlock._get_value()

    def _shown_value(self) -> Any:
        """The value a repr shows: ``unknown`` when it cannot be read."""
        try:
            return self._semlock._get_value()
        except Exception:  # noqa: BLE001 - as multiprocessing's repr
            return "unknown"

    def _describe(self, me: str) -> str:
        return f"<{type(self).__name__}(value={self._shown_value()})>"


class BoundedSemaphore(Semaphore):
    """A semaphore that cannot be released above its initial value (ValueError)."""

    _typeid = "BoundedSemaphore"

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        SemLock.__init__(self, SEMAPHORE, value, value)

    def _describe(self, me: str) -> str:
        return (f"<{type(self).__name__}(value={self._shown_value()}, "
                f"maxvalue={self._semlock.maxvalue})>")


class Lock(SemLock):
    """A non-recursive lock (any process or thread may release it)."""

    _typeid = "Lock"

    def __init__(self, *, ctx: Any = None) -> None:
        SemLock.__init__(self, SEMAPHORE, 1, 1)


class RLock(SemLock):
    """A recursive lock: its owner thread may acquire it again, and only it releases."""

    _typeid = "RLock"

    def __init__(self, *, ctx: Any = None) -> None:
        SemLock.__init__(self, RECURSIVE_MUTEX, 1, 1)

    def _describe(self, me: str) -> str:
        owner, count = self._owner(me)
        return f"<{type(self).__name__}({owner}, {count})>"


def _part_state(part: SemLock) -> tuple[str, Any] | None:
    state = part._native_state()
    return None if state is None else (type(part).__name__, state)


def _attach_part(state: tuple[str, Any]) -> Any:
    cls_name, part_state = state
    return _CLASSES[cls_name]._attach(part_state)


class Condition:
    """A condition variable over ``lock`` (a :class:`Lock` or :class:`RLock`; a new
    :class:`RLock` by default), with multiprocessing's algorithm: three semaphores
    count the sleepers, wake them and wait until they woke."""

    _typeid = "Condition"

    def __init__(self, lock: SemLock | None = None, *, ctx: Any = None) -> None:
        if lock is None:
            lock = RLock()
        elif not isinstance(lock, SemLock):
            raise TypeError(f"a Condition's lock must be a Lock or an RLock of "
                            f"fiber.synchronize, not {type(lock).__name__}")
        self._lock = lock
        self._sleeping_count = Semaphore(0)
        self._woken_count = Semaphore(0)
        self._wait_semaphore = Semaphore(0)
        self._make_methods()

    def _make_methods(self) -> None:
        self.acquire = self._lock.acquire
        self.release = self._lock.release

    def _parts(self) -> tuple[SemLock, ...]:
        return (self._lock, self._sleeping_count, self._woken_count, self._wait_semaphore)

    def _native_state(self) -> tuple[Any, ...] | None:
        states = tuple(_part_state(part) for part in self._parts())
        return None if None in states else states

    @classmethod
    def _attach(cls, state: tuple[Any, ...]) -> Any:
        self = cls.__new__(cls)
        (self._lock, self._sleeping_count, self._woken_count,
         self._wait_semaphore) = (_attach_part(part) for part in state)
        self._make_methods()
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self)

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *args: object) -> None:
        return self._lock.__exit__(*args)

    def _describe(self, me: str) -> str:
        try:
            waiters: Any = (self._sleeping_count._semlock._get_value()
                            - self._woken_count._semlock._get_value())
        except Exception:  # noqa: BLE001 - as multiprocessing's repr
            waiters = "unknown"
        return f"<{type(self).__name__}({self._lock._describe(me)}, {waiters})>"

    def __repr__(self) -> str:
        return self._describe(_me())

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notification (or ``timeout`` seconds), take the
        lock again; False if the wait timed out."""
        lock = self._lock._semlock
        assert lock._is_mine(), "must acquire() condition before using wait()"
        self._sleeping_count.release()  # one more sleeper
        depth = lock._count()
        for _ in range(depth):  # an RLock may be held several times
            lock.release()
        try:
            return self._wait_semaphore.acquire(True, timeout)
        finally:
            self._woken_count.release()  # this sleeper woke (notified or timed out)
            for _ in range(depth):
                lock.acquire()

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters (the lock must be held)."""
        assert self._lock._semlock._is_mine(), "lock is not owned"
        assert not self._wait_semaphore.acquire(False), \
            "notify: Should not have been able to acquire _wait_semaphore"
        # sleepers that woke by timeout since the last notify are sleepers no more
        while self._woken_count.acquire(False):
            taken = self._sleeping_count.acquire(False)
            assert taken, "notify: Bug in sleeping_count.acquire - res should not be False"
        woken = 0
        while woken < n and self._sleeping_count.acquire(False):
            self._wait_semaphore.release()
            woken += 1
        if woken:
            for _ in range(woken):  # until each of them has left wait()
                self._woken_count.acquire()
            while self._wait_semaphore.acquire(False):  # one that timed out meanwhile
                pass

    def notify_all(self) -> None:
        """Wake every waiter."""
        self.notify(sys.maxsize)

    def wait_for(self, predicate: Callable[[], Any],
                 timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (or ``timeout`` seconds); its last value."""
        result = predicate()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not result:
            left = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
            self.wait(left)
            result = predicate()
        return result


class Event:
    """An event: ``set``, ``clear``, ``is_set`` and ``wait(timeout)``."""

    _typeid = "Event"

    def __init__(self, *, ctx: Any = None) -> None:
        self._cond = Condition(Lock())
        self._flag = Semaphore(0)

    def _native_state(self) -> tuple[Any, ...] | None:
        cond, flag = self._cond._native_state(), self._flag._native_state()
        return None if cond is None or flag is None else (cond, flag)

    @classmethod
    def _attach(cls, state: tuple[Any, ...]) -> Any:
        self = cls.__new__(cls)
        self._cond = Condition._attach(state[0])
        self._flag = Semaphore._attach(state[1])
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self)

    def is_set(self) -> bool:
        """Whether the flag is set."""
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

    def set(self) -> None:
        """Set the flag and wake every waiter."""
        with self._cond:
            self._flag.acquire(False)
            self._flag.release()
            self._cond.notify_all()

    def clear(self) -> None:
        """Reset the flag."""
        with self._cond:
            self._flag.acquire(False)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set (or ``timeout`` seconds); whether it is."""
        with self._cond:
            if self._flag.acquire(False):
                self._flag.release()
            else:
                self._cond.wait(timeout)
            if self._flag.acquire(False):
                self._flag.release()
                return True
            return False

    def _describe(self, me: str) -> str:
        return f"<{type(self).__qualname__} at {id(self):#x} " \
               f"{'set' if self.is_set() else 'unset'}>"

    def __repr__(self) -> str:
        return self._describe(_me())


class Barrier(threading.Barrier):
    """A barrier for ``parties`` processes (threading.Barrier's algorithm over a
    :class:`Condition` and two shared counters: its state and the waiters)."""

    _typeid = "Barrier"

    def __init__(self, parties: int, action: Callable[[], object] | None = None,
                 timeout: float | None = None, *, ctx: Any = None) -> None:
        try:
            buffer: SharedBuffer | None = SharedBuffer(8)
        except OSError as exc:
            logger.debug("no shared memory for a Barrier (%s): served by its creator", exc)
            buffer = None
        self._setup(parties, action, timeout, Condition(), buffer)
        self._state = 0
        self._count = 0

    def _setup(self, parties: int, action: Callable[[], object] | None,
               timeout: float | None, cond: Condition, buffer: SharedBuffer | None) -> None:
        self._parties, self._action, self._timeout = parties, action, timeout
        self._cond = cond  # threading.Barrier's algorithm, over ours
        self._buffer = buffer  # kept: the mapping lives as long as this object
        memory = memoryview(buffer.map) if buffer is not None else memoryview(bytearray(8))
        self._array = memory[:8].cast("i")

    def _native_state(self) -> tuple[Any, ...] | None:
        cond = self._cond._native_state()
        if cond is None or self._buffer is None:
            return None
        return (self._parties, self._action, self._timeout, cond, self._buffer.name)

    @classmethod
    def _attach(cls, state: tuple[Any, ...]) -> Any:
        parties, action, timeout, cond, name = state
        try:
            buffer = SharedBuffer.attach(name, 8)
        except FileNotFoundError:
            raise FileNotFoundError(
                "the barrier is gone: the process that created it has exited (a shared "
                "object must be received while its creator runs)") from None
        self = cls.__new__(cls)
        self._setup(parties, action, timeout, Condition._attach(cond), buffer)
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reduce(self)

    # threading.Barrier's counters, in shared memory
    @property
    def _state(self) -> int:
        return self._array[0]

    @_state.setter
    def _state(self, value: int) -> None:
        self._array[0] = value

    @property
    def _count(self) -> int:
        return self._array[1]

    @_count.setter
    def _count(self, value: int) -> None:
        self._array[1] = value

    def _describe(self, me: str) -> str:
        return threading.Barrier.__repr__(self)


_CLASSES: dict[str, Any] = {cls.__name__: cls for cls in (
    SemLock, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event, Barrier)}


sync_proxies.register(_rebuild, _me)
