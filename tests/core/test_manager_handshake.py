"""A manager's server that goes away during the authkey handshake gives the same named
error as one that goes away later (not a bare ConnectionResetError or EOFError)."""

from __future__ import annotations

import socket
import threading

import pytest

from fiber.errors import ConnectionLostError
from fiber.runtime.managers import connection


def test_server_closing_during_the_handshake_is_connection_lost():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept_and_close():
        conn, _ = server.accept()
        conn.close()

    thread = threading.Thread(target=accept_and_close)
    thread.start()
    try:
        with pytest.raises(ConnectionLostError, match="manager at 127.0.0.1"):
            connection.Client(("127.0.0.1", port), authkey=b"k" * 32)
    finally:
        thread.join(10)
        server.close()


def test_a_wrong_key_gets_the_failure_message_only():
    """A manager's server refuses a client with another key with multiprocessing's
    failure message and closes the connection: no pickled traceback (which named the
    interpreter's paths) follows, and the server goes on serving the run. (The
    attempt is a warning in the server job's log, not checked here.) Fails on 764f3f0."""
    import struct

    import fiber

    with fiber.Manager() as manager:
        host, port = manager.address
        with socket.create_connection((host, port), timeout=10) as sock:
            size = struct.unpack("!i", _recv_exact(sock, 4))[0]
            assert _recv_exact(sock, size).startswith(b"#CHALLENGE#")
            wrong = b"\0" * 16  # an md5-sized answer made with no key at all
            sock.sendall(struct.pack("!i", len(wrong)) + wrong)
            size = struct.unpack("!i", _recv_exact(sock, 4))[0]
            assert _recv_exact(sock, size) == b"#FAILURE#"
            sock.settimeout(10)
            rest = b""
            while chunk := sock.recv(65536):
                rest += chunk
            assert rest == b""  # closed, nothing more (before: a pickled traceback)
        # the server still serves the run
        assert manager.dict(a=1)["a"] == 1


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data
