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
