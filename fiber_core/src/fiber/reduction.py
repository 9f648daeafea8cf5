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
  address), as multiprocessing's. A fiber ``Connection`` has no socket (its ends may
  be on different machines, where a descriptor means nothing), so passing it raises
  :class:`NotImplementedError` saying so; so does ``DupFd``, which multiprocessing uses
  to hand a descriptor to a child it starts.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import socket
from collections.abc import Callable
from typing import Any

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
    from fiber.connection import Connection  # (a fiber end's fileno() is no socket)

    try:
        if isinstance(conn, Connection):
            raise OSError("a fiber Connection's fileno() is a readiness descriptor")
        fd = conn.fileno()
    except (OSError, AttributeError) as exc:
        raise NotImplementedError(
            f"{what} needs a connection over a Unix domain socket (a multiprocessing "
            f"Pipe or AF_UNIX Listener/Client); {conn!r} has none: fiber connections "
            "join processes that may run on different machines, where a file "
            "descriptor means nothing") from exc
    return socket.socket(fileno=fd)


def send_handle(conn: Any, handle: int, destination_pid: int) -> None:
    """Send the file descriptor ``handle`` over ``conn`` (see the module's docstring
    for the connections that can carry one)."""
    sock = _unix_socket(conn, "send_handle")
    try:
        sendfds(sock, [handle])
    finally:
        sock.detach()  # the descriptor stays the connection's


def recv_handle(conn: Any) -> int:
    """Receive a file descriptor sent by :func:`send_handle` over ``conn``."""
    sock = _unix_socket(conn, "recv_handle")
    try:
        return recvfds(sock, 1)[0]
    finally:
        sock.detach()


def DupFd(fd: int) -> Any:  # noqa: N802 - multiprocessing's name
    """Not available: multiprocessing duplicates a descriptor for a child it starts
    on this machine; a fiber child is a job that may run anywhere."""
    raise NotImplementedError(
        "DupFd: a file descriptor cannot be handed to a fiber process (a job that may "
        "run on another machine); send the data, or a path the job can open")


class AbstractReducer:
    """What ``ctx.reducer`` is in multiprocessing: the reduction functions as
    attributes (subclass it to provide others)."""

    ForkingPickler = ForkingPickler
    register = staticmethod(register)
    dump = staticmethod(dump)
    send_handle = staticmethod(send_handle)
    recv_handle = staticmethod(recv_handle)
    DupFd = staticmethod(DupFd)
