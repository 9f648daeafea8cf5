"""A manager's server job: waiting for its address, serving, shutting it down.

:meth:`fiber.managers.BaseManager.start` starts the server in a daemonic fiber
Process and gives this module the process and the reading end of the Pipe over which
the server reports the address it listens on (:func:`await_address`). In the job,
:func:`serve` listens at the address that job's backend says other jobs can reach
(:func:`fiber.runtime.run.listen_host`), or at the address its manager was given,
reports the address other processes reach it at (a wildcard host replaced by the
job's reachable one) and serves until asked to stop.
:func:`finalize` stops it: it asks the server, then terminates and kills the job if it
does not end. Every manager started in this process is stopped at exit, before fiber
ends its children (:data:`fiber.util.MANAGERS`).

This module does not import the API: the process and the pipe are handed to it, and
described here by the little it uses of them (:class:`ServerProcess`,
:class:`AddressReader`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from fiber import util
from fiber.errors import ProcessError
from fiber.runtime import run
from fiber.runtime.managers import stdlib
from fiber.runtime.managers.connection import share_authkey
from fiber.wire import auth

__all__ = ["START_TIMEOUT", "SHUTDOWN_TIMEOUT", "ServerProcess", "AddressReader",
           "check_startable", "await_address", "started", "serve", "finalize",
           "shutdown_all"]

logger = logging.getLogger("fiber.managers")

START_TIMEOUT = 300.0      # the server's job must report its address within this
SHUTDOWN_TIMEOUT = 10.0

_started: weakref.WeakSet[Any] = weakref.WeakSet()


class ServerProcess(Protocol):
    """What this module uses of the process running a server (a fiber Process)."""

    @property
    def exitcode(self) -> int | None: ...
    def is_alive(self) -> bool: ...
    def join(self, timeout: float | None = None) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class AddressReader(Protocol):
    """What this module uses of the end of the pipe the server reports on."""

    def poll(self, timeout: float | None = 0.0) -> bool: ...
    def recv(self) -> Any: ...
    def close(self) -> None: ...


def check_startable(state: Any) -> None:
    """Raise ProcessError unless a manager in ``state`` may start its server."""
    if state.value != stdlib.State.INITIAL:
        if state.value == stdlib.State.STARTED:
            raise ProcessError("Already started server")
        raise ProcessError(f"Unknown state {state.value!r}")


def await_address(process: ServerProcess, reader: AddressReader, name: str) -> tuple:
    """The address the server running in ``process`` reports on ``reader`` (which is
    closed); kills the process and raises ProcessError if the server ends or does not
    listen within :data:`START_TIMEOUT` seconds."""
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not reader.poll(0.5):
            if not process.is_alive():
                process.join(5)  # raises ProcessStartError if the job never ran
                raise ProcessError(
                    f"the server of {name} ended (exit code {process.exitcode}) before "
                    "it listened; see its output above")
            if time.monotonic() > deadline:
                raise ProcessError(f"the server of {name} did not start within "
                                   f"{START_TIMEOUT:.0f}s")
        return tuple(reader.recv())
    except BaseException:
        process.kill()
        raise
    finally:
        reader.close()


def started(manager: Any, finalizer: Callable[..., None]) -> None:
    """Record that ``manager``'s server listens: its state, its ``shutdown()`` (which
    calls ``finalizer``) and its shutdown at exit."""
    manager._state.value = stdlib.State.STARTED
    manager.shutdown = stdlib.Finalize(
        manager, finalizer,
        args=(manager._process, manager._address, manager._authkey, manager._state,
              manager._Client, manager._shutdown_timeout),
        exitpriority=0)
    _started.add(manager)
    util.at_exit("managers", util.MANAGERS, shutdown_all)
    logger.debug("%s serving at %s:%s", type(manager).__name__, *manager._address)


def serve(cls: type, registry: dict[str, Any], address: tuple | None, serializer: str,
          writer: Any, initializer: Callable[..., object] | None = None,
          initargs: Iterable[Any] = (), authkey: bytes | None = None) -> None:
    """In the server's job: listen at this job's reachable address (unless ``address``
    says otherwise), report it on ``writer`` and serve until asked to stop. ``authkey``
    is the one its manager was given, None for the run's secret."""
    if address is None:
        address = (run.listen_host(), 0)
    share_authkey()
    stdlib.run_server(cls, registry, address,
                      authkey if authkey is not None else auth.get_authkey(), serializer,
                      _ReachableAddress(writer), initializer, initargs)


_WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class _ReachableAddress:
    """The end of the pipe a server job reports its address on, as the standard
    library's server writes to it: a server bound to every address of its host
    (``('', port)``, as multiprocessing's documentation binds one that other machines
    use) reports the address this job is reached at, with the bound port, not
    ``0.0.0.0``, which the manager's program would take for its own machine."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def send(self, address: Any) -> None:
        if isinstance(address, tuple) and address and address[0] in _WILDCARDS:
            address = (run.listen_host(), *address[1:])
        self._writer.send(address)

    def close(self) -> None:
        self._writer.close()


def finalize(process: ServerProcess, address: tuple, authkey: bytes, state: Any,
             client: Callable[..., Any], shutdown_timeout: float) -> None:
    """Ask the server to stop; terminate, then kill its job if it does not."""
    try:
        if process.is_alive():
            try:
                conn = client(address, authkey=authkey)
                try:
                    stdlib.shutdown_server(conn)
                finally:
                    conn.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                logger.debug("asking the manager to shut down failed", exc_info=True)
            for end in (None, process.terminate, process.kill):
                if end is not None and process.is_alive():
                    end()
                try:
                    process.join(timeout=shutdown_timeout)
                except ProcessError:
                    break
                if not process.is_alive():
                    break
    finally:
        state.value = stdlib.State.SHUTDOWN
        stdlib.forget_address(address)


def shutdown_all() -> None:
    """At exit, before fiber ends its children: stop the managers of this process."""
    for manager in list(_started):
        try:
            if manager._state.value == stdlib.State.STARTED:
                manager.shutdown()
        except Exception:  # noqa: BLE001 - best effort at exit
            logger.debug("shutting down %r failed", manager, exc_info=True)
