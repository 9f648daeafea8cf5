"""fiber's manager server: the standard library's ``Server`` behind fiber's gate.

A manager's server and the server of a process's shared objects are
:class:`multiprocessing.managers.Server` objects, which would authenticate each new
connection on a thread of its own, with no deadline, and answer a failed attempt with
a pickled traceback. :class:`FiberServer` changes what happens before a connection is
trusted and nothing after:

- its listener (the "fiber" serializer's, :class:`~fiber.runtime.managers.connection.Listener`)
  authenticates on a gate (:mod:`fiber.wire.gate`): strangers cost no thread, bounded
  memory and a deadline, and a failed attempt is a logged warning and multiprocessing's
  failure message;
- a request on an authenticated connection is handled as the standard library does,
  without a second handshake;
- its accepting thread survives everything (a thread that cannot be started closes
  that one connection, with a rate-limited warning).
"""

from __future__ import annotations

import functools
import logging
import traceback
from typing import Any

from fiber import threads
from fiber.errors import FiberThreadError
from fiber.runtime.managers import stdlib
from fiber.runtime.managers.connection import Listener
from fiber.wire.gate import RateLimitedLog

__all__ = ["FiberServer", "accept_died", "accept_forever"]

logger = logging.getLogger("fiber")
_log = RateLimitedLog()


def accept_forever(server: Any, name: str, stopping: Any = None) -> None:
    """``server``'s accepting loop: a thread per authenticated connection, named
    ``name`` (a kind of :mod:`fiber.threads`: its death fails that connection's
    call); returns when its listener is closed (or ``stopping()`` holds)."""
    listener = server.listener
    while True:
        try:
            conn = listener.accept()
        except OSError:
            if getattr(listener, "closed", False) or (stopping is not None and stopping()):
                return
            continue
        except Exception as exc:  # noqa: BLE001 - the loop outlives anything
            _log.warning("%s: accepting a connection failed (%s: %s): going on",
                         name, type(exc).__name__, exc)
            continue
        try:
            threads.start(name, server.handle_request, conn,
                          fails=functools.partial(_line_died, conn))
        except Exception as exc:  # noqa: BLE001 - e.g. no thread can be started now
            _log.warning("%s: cannot serve a connection (%s: %s): closed it", name,
                         type(exc).__name__, exc)
            try:
                conn.close()
            except OSError:
                pass


def accept_died(server: Any, error: FiberThreadError) -> None:
    """The thread running :func:`accept_forever` died: close ``server``'s listener
    (clients connecting are refused at once) and fail the connections it had admitted
    but not handed to a thread (their calls raise ``error``)."""
    listener = server.listener
    try:
        listener.close()
    except OSError:
        pass
    while True:
        try:
            conn = listener.accept()
        except Exception:  # noqa: BLE001 - closed: none left
            return
        _line_died(conn, error)


def _line_died(conn: Any, error: FiberThreadError) -> None:
    """The thread serving ``conn`` died: its client's call (waiting for an answer)
    raises ``error`` (multiprocessing's ``#ERROR`` answer), then the line is closed,
    so that its next call fails too rather than wait for a server that is gone."""
    try:
        conn.send(("#ERROR", error))
    except Exception:  # noqa: BLE001 - closing it tells the client anyway
        logger.debug("telling a manager's client that its line died failed", exc_info=True)
    try:
        conn.close()
    except OSError:
        pass


class FiberServer(stdlib.Server):
    """A manager's server whose connections are authenticated by its listener's gate."""

    line_name = "fiber-manager-line"

    def __init__(self, registry: dict[str, Any], address: tuple, authkey: bytes,
                 serializer: str) -> None:
        super().__init__(registry, address, authkey, serializer)
        if isinstance(self.listener, Listener):
            self.listener.admit(bytes(self.authkey))

    def accepter(self) -> None:
        accept_forever(self, self.line_name)

    def _handle_request(self, conn: Any) -> None:
        if not getattr(conn, "admitted", False):
            super()._handle_request(conn)  # another serializer: the standard library's
            return
        try:
            request = conn.recv()
            _, name, args, kwds = request
            if name not in self.public:
                raise ValueError(f"{name!r} is not a request this server answers")
            method = getattr(self, name)
        except Exception:  # noqa: BLE001 - the (authenticated) client gets the error
            answer: tuple = ("#TRACEBACK", traceback.format_exc())
        else:
            try:
                answer = ("#RETURN", method(conn, *args, **kwds))
            except Exception:  # noqa: BLE001
                answer = ("#TRACEBACK", traceback.format_exc())
        try:
            conn.send(answer)
        except Exception:  # noqa: BLE001 - say why, if the connection still can
            logger.debug("a manager's answer could not be sent", exc_info=True)
            try:
                conn.send(("#TRACEBACK", traceback.format_exc()))
            except Exception:  # noqa: BLE001
                pass
