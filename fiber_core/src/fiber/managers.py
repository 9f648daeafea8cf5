"""Managers: shared objects served by a job-backed process, as
:mod:`multiprocessing.managers`.

fiber reuses the standard library's manager machinery (``Server``, ``BaseProxy``,
``register``) and changes what must change for a cluster:

* the server runs in a :class:`fiber.Process` (a job on the selected backend) and
  listens on TCP at the address that job's backend says other jobs can reach
  (:func:`fiber.runtime.run.listen_host`, e.g. 127.0.0.1 on the local backend), or at
  the ``address`` given, on the job's host; it reports the bound address back over a
  fiber Pipe (for a wildcard host, ``('', port)``, the job's reachable address: the
  program's ``m.address`` must name the job's host, not ``0.0.0.0``);
* the authkey is the run's secret (:func:`fiber.wire.auth.get_authkey`) unless one is
  given, so any process of the run can use a proxy it received, on any machine; an
  authkey given (``BaseManager(address, authkey=b"...")``, as for a manager that other
  programs connect to) is the one the server checks, as in multiprocessing;
* connections use the ``"fiber"`` serializer: TCP keepalive and a user timeout make a
  vanished server fail a call within seconds (:class:`fiber.ConnectionLostError`)
  instead of hanging, and an exception raised by a method in the server is re-raised
  in the caller with the remote traceback as its ``__cause__``.

:class:`AsyncManager` makes proxies whose method calls return an
:class:`AsyncResult` at once: each proxy has its own connection, served by its own
thread in the server, so calls on many objects run at the same time (objects of one
manager share its server process: calls that hold the GIL do not overlap; use several
managers to spread CPU-bound objects over processes and machines).

This module is the public face; the machinery is in :mod:`fiber.runtime.managers`.
Primitives usable without a manager (``fiber.Lock()``, ``fiber.Value()``...) are in
:mod:`fiber.synchronize` and :mod:`fiber.sharedctypes`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fiber import util
from fiber.errors import ProcessError
from fiber.runtime import run
from fiber.runtime.managers import server, stdlib, sync
from fiber.runtime.managers.connection import SERIALIZER, RemoteTraceback, share_authkey
from fiber.runtime.managers.proxies import (
    AsyncAutoProxy,
    AsyncBaseProxy,
    AsyncResult,
    AutoProxy,
    BaseProxy,
)
from fiber.runtime.managers.serving import FiberServer
from fiber.shared_memory import SharedMemoryManager
from fiber.wire import auth

if TYPE_CHECKING:
    from fiber.process import Process

__all__ = [
    "BaseManager", "SyncManager", "AsyncManager", "AsyncResult", "BaseProxy", "AutoProxy",
    "AsyncBaseProxy", "AsyncAutoProxy", "Namespace", "Token", "RemoteTraceback",
    "RemoteError", "Manager", "shutdown_implicit_manager", "SharedMemoryManager",
]

Token = stdlib.Token
Namespace = stdlib.Namespace
# what a proxy raises when the server reports an error that is not the method's own
# exception: the server is multiprocessing's, so the class is too
RemoteError = stdlib.RemoteError

_callable = callable  # register() has an argument named callable


class BaseManager(stdlib.BaseManager):
    """:class:`multiprocessing.managers.BaseManager` whose server is a fiber job.

    ``address`` defaults to the reachable address of the server's job with a free
    port; ``authkey`` to the run's secret.
    """

    _default_proxy = staticmethod(AutoProxy)
    # the server authenticates on a gate (runtime/managers/serving.py)
    _Server = FiberServer

    if TYPE_CHECKING:  # set by the standard library's BaseManager (see runtime.managers.stdlib)
        _address: tuple | None
        _authkey: bytes
        _state: Any
        _registry: dict[str, tuple[Any, Any, Any, Any]]
        _serializer: str
        _process: Process
        _Client: Callable[..., Any]
        _shutdown_timeout: float
        _ctx: Any  # the context given, else multiprocessing's default (stdlib's __init__)

    def __init__(self, address: tuple | None = None, authkey: bytes | None = None,
                 serializer: str = SERIALIZER, ctx: Any = None, *,
                 shutdown_timeout: float = server.SHUTDOWN_TIMEOUT) -> None:
        if not stdlib.has_serializer(serializer):
            raise ValueError(f"unknown serializer {serializer!r}: use 'fiber' (the default)")
        share_authkey()
        super().__init__(address, authkey if authkey is not None else auth.get_authkey(),
                         serializer, ctx, **stdlib.manager_init_kwargs(shutdown_timeout))
        self._shutdown_timeout = shutdown_timeout
        # an authkey the user chose goes to the server's job, which must check it; the
        # run's secret it has already
        self._given_authkey = bytes(authkey) if authkey is not None else None

    @classmethod
    def register(cls, typeid: str, callable: Callable[..., Any] | None = None,  # noqa: A002
                 proxytype: Any = None, exposed: Sequence[str] | None = None,
                 method_to_typeid: Mapping[str, str] | None = None,
                 create_method: bool = True) -> None:
        """Register a type (or callable) the manager can create, as in multiprocessing."""
        if not isinstance(typeid, str) or not typeid.isidentifier():
            raise ValueError(f"typeid must be a Python identifier, not {typeid!r}")
        if callable is not None and not _callable(callable):
            raise TypeError(f"register({typeid!r}, ...): {callable!r} is not callable")
        if proxytype is None:
            proxytype = cls._default_proxy
        super().register(typeid, callable, proxytype, exposed, method_to_typeid,
                         create_method)

    def get_server(self) -> Any:
        """A server to run in this process (``serve_forever()``)."""
        if self._address is None:  # where its context's jobs reach this process
            self._address = (run.of(self._ctx).listen_host(), 0)
        if self._state.value == stdlib.State.SHUTDOWN:
            raise ProcessError("Manager has shut down")
        server.check_startable(self._state)
        return FiberServer(self._registry, self._address, self._authkey, self._serializer)

    def start(self, initializer: Callable[..., object] | None = None,
              initargs: Iterable[Any] = ()) -> None:
        """Start the server as a fiber job and wait until it listens."""
        # imported here for start-up time: a job that only defines or receives managers
        # and proxies does not load fiber's processes and pipes (about 20 ms)
        from fiber.connection import Pipe
        from fiber.process import Process

        server.check_startable(self._state)
        if initializer is not None and not _callable(initializer):
            raise TypeError("initializer must be a callable")
        # the server is a job of the manager's context (a fiber context's Process);
        # no context, or multiprocessing's: the default context's
        ctx: Any = self._ctx if run.carries(self._ctx) else None
        process_class = ctx.Process if ctx is not None else Process
        reader, writer = Pipe(duplex=False, ctx=ctx)
        self._process = process_class(
            target=type(self)._run_server,
            args=(self._registry, self._address, self._given_authkey, self._serializer,
                  writer, initializer, initargs),
            name=type(self).__name__, daemon=True)
        self._process.start()
        self._address = server.await_address(self._process, reader, type(self).__name__)
        server.started(self, type(self)._finalize_manager)

    @classmethod
    def _run_server(cls, registry: dict[str, Any], address: tuple | None,
                    authkey: bytes | None, serializer: str, writer: Any,
                    initializer: Callable[..., object] | None = None,
                    initargs: Iterable[Any] = ()) -> None:
        """In the server's job: listen at this job's reachable address."""
        server.serve(cls, registry, address, serializer, writer, initializer, initargs,
                     authkey)

    _finalize_manager = staticmethod(server.finalize)

    @property
    def process(self) -> Process | None:
        """fiber extension: the Process (a fiber job) that runs this manager's server,
        None before :meth:`start` (and for a manager that connects to a server it did
        not start). For code that watches the server: ``join``, ``is_alive``,
        ``exitcode``, ``pid``; ``shutdown()`` remains the way to end it."""
        return getattr(self, "_process", None)

    def __repr__(self) -> str:
        where = f" at {self._address[0]}:{self._address[1]}" if self._address else ""
        return f"<{type(self).__name__}{where} state={self._state.value}>"


class AsyncManager(BaseManager):
    """A manager whose proxies' methods return :class:`AsyncResult` handles at once
    (``register`` makes :func:`AsyncAutoProxy` proxies unless told otherwise)."""

    _default_proxy = staticmethod(AsyncAutoProxy)


if TYPE_CHECKING:
    # what register() below adds to SyncManager, typed as the standard SyncManager's
    _SyncManagerMethods = stdlib.SyncManager
else:
    _SyncManagerMethods = object


class SyncManager(BaseManager, _SyncManagerMethods):
    """:class:`multiprocessing.managers.SyncManager` served by a fiber job: Queue,
    JoinableQueue, Lock, RLock, Semaphore, BoundedSemaphore, Condition, Event, Barrier,
    Pool, list, dict, Value, Array, Namespace.

    ``Pool`` runs multiprocessing workers inside the manager's job (on its machine);
    :class:`fiber.Pool` spreads workers over the cluster."""

    if TYPE_CHECKING:  # fiber's own types, also made by register() below
        def SynchronizedValue(self, typecode_or_type: str | type,
                              *args: Any) -> sync.SynchronizedValueProxy: ...

        def SynchronizedArray(self, typecode_or_type: str | type,
                              size_or_initializer: int | Iterable[Any],
                              ) -> sync.SynchronizedArrayProxy: ...


for _entry in sync.registrations():
    SyncManager.register(_entry.typeid, _entry.callable, _entry.proxytype, _entry.exposed,
                         _entry.method_to_typeid, _entry.create_method)
del _entry


def Manager(*, ctx: Any = None) -> SyncManager:
    """A started :class:`SyncManager` whose server is a job of ``ctx`` (``ctx.Manager()``,
    ``fiber.Manager()``: the default context)."""
    manager = SyncManager(ctx=ctx)
    manager.start()
    return manager


def shutdown_implicit_manager() -> None:
    """Deprecated; does nothing. ``fiber.Lock()``, ``fiber.Value()``... were served by
    a manager the process started on first use; they are shared memory now (and their
    creator serves them to other hosts), so there is no such manager to stop."""
    util.warn_deprecated("shutdown_implicit_manager",
                         "fiber.managers.shutdown_implicit_manager() does nothing: "
                         "fiber.Lock(), fiber.Value()... no longer run in a manager")
