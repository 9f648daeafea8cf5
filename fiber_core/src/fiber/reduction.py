"""``fiber.reduction``: multiprocessing.reduction's names for fiber.

* ``ForkingPickler``, ``register``, ``dump`` and ``AbstractReducer`` as there. One
  difference: a reducer given to ``register`` (or ``ForkingPickler.register``) is
  also registered with :mod:`copyreg`, because fiber's wire pickles with the standard
  pickle (and cloudpickle, which reads copyreg's table too), not with a
  ForkingPickler; so it applies to every object fiber sends, and to plain
  ``pickle.dumps`` in this process. Register it in every process that sends such
  objects (at import of the module that defines the type, for example).
* ``sendfds``/``recvfds`` pass file descriptors over a Unix domain socket, and
  ``send_handle``/``recv_handle`` over a connection that has one (a
  ``multiprocessing`` Pipe, or a Listener/Client connection on an ``AF_UNIX``
  address), as multiprocessing's, and over a fiber ``Connection`` (which has no
  socket: the descriptor travels as ``DupFd`` does, below). Another object raises
  :class:`NotImplementedError` saying so.
* ``DupFd(fd)`` hands a descriptor to another process as multiprocessing's does (its
  ``detach()`` there returns a descriptor of that process's own), and connections
  and sockets sent through fiber's queues, pipes, pools and Process arguments travel
  the same way (:mod:`fiber.wire.handles`): duplicated into a receiver of the same
  kernel and network namespace, refused with :class:`fiber.errors.HandleError`
  elsewhere.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import socket
from collections.abc import Callable
from typing import Any

from fiber.wire.handles import SharedFd

__all__ = ["send_handle", "recv_handle", "ForkingPickler", "register", "dump", "DupFd",
           "sendfds", "recvfds", "AbstractReducer", "HAVE_SEND_HANDLE"]

HAVE_SEND_HANDLE = True  # over Unix domain sockets (not over fiber connections)


class ForkingPickler(pickle.Pickler):
    """A pickler that also uses the reducers given to :meth:`register`."""

    _extra_reducers: dict[type, Callable[[Any], Any]] = {}
    _copyreg_dispatch_table = copyreg.dispatch_table
    loads = staticmethod(pickle.loads)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dispatch_table = self._copyreg_dispatch_table.copy()
        self.dispatch_table.update(self._extra_reducers)

    @classmethod
    def register(cls, type: type, reduce: Callable[[Any], Any]) -> None:  # noqa: A002
        """Use ``reduce(obj)`` to pickle objects of ``type``; see the module's
        docstring for where it applies."""
        cls._extra_reducers[type] = reduce
        copyreg.pickle(type, reduce)

    @classmethod
    def dumps(cls, obj: Any, protocol: int | None = None) -> memoryview:
        buf = io.BytesIO()
        cls(buf, protocol).dump(obj)
        return buf.getbuffer()


register = ForkingPickler.register


def dump(obj: Any, file: Any, protocol: int | None = None) -> None:
    """``pickle.dump`` with the registered reducers (as multiprocessing's)."""
    ForkingPickler(file, protocol).dump(obj)


def sendfds(sock: socket.socket, fds: list[int]) -> None:
    """Send the file descriptors ``fds`` over the Unix domain socket ``sock``."""
    socket.send_fds(sock, [bytes([len(fds) % 256])], list(fds))


def recvfds(sock: socket.socket, size: int) -> list[int]:
    """Receive ``size`` file descriptors sent by :func:`sendfds` over ``sock``."""
    msg, fds, _, _ = socket.recv_fds(sock, 1, size)
    if not msg and not fds:
        raise EOFError
    if len(fds) != size or msg[0] != size % 256:
        raise RuntimeError(f"received {len(fds)} file descriptors, expected {size}")
    return list(fds)


def _unix_socket(conn: Any, what: str) -> socket.socket:
    try:
        fd = conn.fileno()
    except (OSError, AttributeError) as exc:
        raise NotImplementedError(
            f"{what} needs a fiber Connection or a connection over a Unix domain socket "
            f"(a multiprocessing Pipe or AF_UNIX Listener/Client); {conn!r} is "
            "neither") from exc
    return socket.socket(fileno=fd)


def _is_fiber_connection(conn: Any) -> bool:
    from fiber.connection import Connection

    return isinstance(conn, Connection)


def send_handle(conn: Any, handle: int, destination_pid: int) -> None:
    """Send the file descriptor ``handle`` over ``conn`` (see the module's docstring
    for the connections that can carry one)."""
    if _is_fiber_connection(conn):
        conn.send(SharedFd(handle))  # duplicated into the receiver (DupFd)
        return
    sock = _unix_socket(conn, "send_handle")
    try:
        sendfds(sock, [handle])
    finally:
        sock.detach()  # the descriptor stays the connection's


def recv_handle(conn: Any) -> int:
    """Receive a file descriptor sent by :func:`send_handle` over ``conn``."""
    if _is_fiber_connection(conn):
        shared = conn.recv()
        if not isinstance(shared, SharedFd):
            raise TypeError(f"recv_handle received a {type(shared).__name__}, not a "
                            "descriptor sent by send_handle")
        return shared.detach()
    sock = _unix_socket(conn, "recv_handle")
    try:
        return recvfds(sock, 1)[0]
    finally:
        sock.detach()


def DupFd(fd: int) -> SharedFd:  # noqa: N802 - multiprocessing's name
    """A duplicate of ``fd`` to send to another process, as multiprocessing's: its
    ``detach()`` in the process that unpickled it returns a descriptor of that
    process's own. Between processes of one kernel and network namespace only (one
    host, or containers sharing the host's network); elsewhere unpickling raises
    :class:`fiber.errors.HandleError` (:mod:`fiber.wire.handles`)."""
    return SharedFd(fd)


class AbstractReducer:
    """What ``ctx.reducer`` is in multiprocessing: the reduction functions as
    attributes (subclass it to provide others)."""

    ForkingPickler = ForkingPickler
    register = staticmethod(register)
    dump = staticmethod(dump)
    send_handle = staticmethod(send_handle)
    recv_handle = staticmethod(recv_handle)
    DupFd = staticmethod(DupFd)
