"""The synchronization primitives of :mod:`fiber.synchronize` through their creator:
what their pickles carry, and the proxies a process of another host uses.

A primitive's pickle carries its creator's host token (:func:`host`) and its token in
the creator's server (:mod:`fiber.runtime.shared.served`), and, when the creator
could make it of named semaphores, their names (:func:`token_of`). The receiver
(``fiber.synchronize._rebuild``) gets the creator's own object in the creator
(:func:`served_object`), a native object over the same semaphores on its host, else a
proxy of this module: each operation is one round trip to the creator, run there by
a thread that serves that proxy's thread (so an ``RLock`` or a ``Condition`` acquired
through a proxy is owned by the caller's thread, as natively). A proxy has the
primitive's methods and repr; it is not an instance of the primitive's class.

What a proxy needs of the API layer above, :func:`register` is given by
:mod:`fiber.synchronize`: the function that rebuilds a primitive from its pickle, and
the caller's name as a repr names an owner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fiber.runtime import config
from fiber.runtime.managers import sync as _sync
from fiber.runtime.shared import served
from fiber.wire import shm

__all__ = ["host", "register", "served_object", "token_of"]

# -- pickling: native on the creator's host, through the creator elsewhere --------------
_served_here: dict[tuple[Any, str], Any] = {}  # (address, id) -> object, in its creator


def host() -> bytes | None:
    """This host's token (:func:`fiber.wire.shm.host_token`), the ``shared_memory``
    setting applied."""
    config.get_config()  # the shared_memory setting applies (read once)
    return shm.host_token()


def token_of(obj: Any) -> tuple[bytes | None, Any]:
    """The host token and the served token to pickle ``obj`` with."""
    origin = obj.__dict__.get("_origin")
    if origin is not None:  # attached natively: its creator's
        return origin
    token = served.token_for(obj, obj._typeid)
    _served_here[(tuple(token.address), token.id)] = obj
    return (host() if obj._native_state() is not None else None), token


def served_object(token: Any) -> Any:
    """The object ``token`` names if this process created (and served) it, else None."""
    return _served_here.get((tuple(token.address), token.id))


# -- proxies: the same objects through their creator ----------------------------------
def _unregistered(*args: Any) -> Any:
    raise RuntimeError("fiber.synchronize has not registered its primitives")


# fiber.synchronize's, given to register() (no proxy of this module exists before)
_rebuild: Callable[..., Any] = _unregistered
_caller: Callable[[], str] = _unregistered


class _SharedProxyMixin:
    """What the proxies of this module add to the standard ones: a repr like the native
    object's (one round trip), and pickling that gives a process of the creator's host
    the native object."""

    _fiber_state: tuple[Any, ...] = ("SemLock", None, None)

    if TYPE_CHECKING:  # BaseProxy's
        _token: Any

        def _callmethod(self, methodname: str, args: tuple = (),
                        kwds: dict | None = None) -> Any: ...

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        cls_name, state, host = self._fiber_state
        return _rebuild, (cls_name, state, host, self._token)

    def __repr__(self) -> str:
        try:
            return self._callmethod("_describe", (_caller(),))
        except Exception:  # noqa: BLE001 - a repr never fails
            return f"<{self._token.typeid} of a process that cannot be reached>"

    __str__ = __repr__


class _LockProxy(_SharedProxyMixin, _sync.AcquirerProxy):  # type: ignore[name-defined]
    """A Lock or RLock used through its creator."""

    _exposed_: tuple[str, ...] = ("acquire", "release", "_describe")


class _SemaphoreProxy(_LockProxy):
    """A Semaphore or BoundedSemaphore used through its creator."""

    _exposed_ = ("acquire", "release", "get_value", "_describe")

    def get_value(self) -> int:
        """The semaphore's value."""
        return self._callmethod("get_value")


class _ConditionProxy(_SharedProxyMixin, _sync.ConditionProxy):  # type: ignore[name-defined]
    """A Condition used through its creator."""

    _exposed_ = ("acquire", "release", "wait", "notify", "notify_all", "_describe")


class _EventProxy(_SharedProxyMixin, _sync.EventProxy):  # type: ignore[name-defined]
    """An Event used through its creator."""

    _exposed_ = ("is_set", "set", "clear", "wait", "_describe")


class _BarrierProxy(_SharedProxyMixin, _sync.BarrierProxy):  # type: ignore[name-defined]
    """A Barrier used through its creator."""

    _exposed_ = ("__getattribute__", "wait", "abort", "reset", "_describe")


def register(rebuild: Callable[..., Any], caller: Callable[[], str]) -> None:
    """Make the primitives servable (:func:`fiber.runtime.shared.served.register`):
    ``rebuild(cls_name, state, host, token)`` unpickles one (a proxy pickles itself
    as a call of it), ``caller()`` names the calling process and thread in a repr."""
    global _rebuild, _caller
    _rebuild, _caller = rebuild, caller
    for typeid, proxy in (("Lock", _LockProxy), ("RLock", _LockProxy),
                          ("Semaphore", _SemaphoreProxy),
                          ("BoundedSemaphore", _SemaphoreProxy),
                          ("Condition", _ConditionProxy), ("Event", _EventProxy),
                          ("Barrier", _BarrierProxy)):
        served.register(typeid, proxy)
