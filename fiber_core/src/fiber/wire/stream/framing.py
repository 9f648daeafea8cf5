"""The stream wire's frames and addresses, shared by its listening and connecting sides.

A frame is ``length (8 bytes) + line (4 bytes) + body`` (:data:`FRAME`); the body is
the nng wire's message (``b"M" + channel + payload`` for a request, a status byte +
data for a reply, a handshake message first). An address is
``stream://HOST:PORT[?local=NAME]``: a process on the listener's host (and network
namespace) connects to the abstract Unix socket NAME instead of TCP.
"""

from __future__ import annotations

import errno
import socket
import time

from fiber.wire.protocol import STREAM_FRAME as FRAME
from fiber.wire.protocol import STREAM_SCHEME as SCHEME

__all__ = ["BIG", "FRAME", "HANDSHAKE_MAX", "READ_SIZE", "SCHEME", "allocate", "connect",
           "frame", "nodelay", "read_frame_blocking", "split_address"]

HANDSHAKE_MAX = 1024  # the largest frame a handshake may send
READ_SIZE = 64 * 1024  # read into a reused buffer: recv(n) would allocate n bytes
BIG = 1 << 20  # frames from this size are read straight into their own buffer


def split_address(address: str) -> tuple[str, int, str | None]:
    """``stream://HOST:PORT[?local=NAME]`` -> host, port, local socket name; raises
    :class:`ValueError` for anything else (a port that is not a number in 0-65535)."""
    if not address.startswith(SCHEME):
        raise ValueError(f"not a stream address: {address!r}")
    rest, _, query = address[len(SCHEME):].partition("?")
    host, _, port = rest.rpartition(":")
    local = query[len("local="):] if query.startswith("local=") else None
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"not a port number in stream address {address!r}")
    return host.strip("[]"), number, local or None


def connect(host: str, port: int, local: str | None, timeout: float) -> socket.socket:
    """The listener's local (Unix, abstract) socket when this process shares its host
    and network namespace, else TCP."""
    if local and hasattr(socket, "AF_UNIX"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect("\0" + local)
            return sock
        except OSError:
            sock.close()  # another host or namespace: TCP it is
    sock = _connect_tcp(host, port, timeout)
    nodelay(sock)
    return sock


# errors that say the path to the listener is down, not that nobody listens: a link
# cut for a moment (a host's network restarting, a switch, a cut veth in the tests)
#: seconds one TCP connect attempt waits for an answer before it is made again
ATTEMPT_SECONDS = 2.0

_PATH_DOWN = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN,
                        errno.EHOSTDOWN})


def _connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    """Connect within ``timeout`` seconds, trying again while the path is down (a
    starting job whose host lost its link for a few seconds still connects: one that
    was already connected rides out such an outage too, see heartbeat_timeout); any
    other error, or the path still down at the deadline, raises at once. An attempt
    that gets no answer (a link whose packets go nowhere: the kernel sends its SYN
    again only after 1, 3, 7, 15 s) is given up after ``ATTEMPT_SECONDS`` and made
    again, so that a link back just before the deadline is still used."""
    deadline = time.monotonic() + timeout
    pause = 0.05
    while True:
        left = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port),
                                            timeout=max(min(left, ATTEMPT_SECONDS), 0.05))
        except TimeoutError:
            if deadline - time.monotonic() <= 0:
                raise
            continue  # no answer within the attempt: a new SYN at once
        except OSError as exc:
            if exc.errno not in _PATH_DOWN or left <= 0:
                raise
        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)


def nodelay(sock: socket.socket) -> None:
    """Send small frames at once (TCP; nothing to do on a Unix socket)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not TCP
        pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("connection closed")
        data += chunk
    return bytes(data)


def read_frame_blocking(sock: socket.socket, limit: int) -> tuple[int, bytes] | None:
    """The next frame (line, body) from a blocking socket (handshakes only); None when
    its body would be longer than ``limit``. Raises :class:`OSError` when the
    connection ends or times out."""
    size, line = FRAME.unpack(_recv_exact(sock, FRAME.size))
    if size > limit:
        return None
    return line, _recv_exact(sock, size)


def allocate(size: int) -> bytearray:
    """The buffer of a frame's body of ``size`` bytes; :class:`ConnectionResetError`
    when no such buffer can be had (a length no fiber peer sends: the connection is
    dropped, and the thread that reads it goes on)."""
    try:
        return bytearray(size)
    except (MemoryError, OverflowError):
        raise ConnectionResetError(
            f"a frame of {size} bytes announced, more than can be allocated") from None


def frame(line: int, body: bytes) -> bytes:
    """``body`` as a frame on ``line``."""
    return FRAME.pack(len(body), line) + body
