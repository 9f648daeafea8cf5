"""Listeners that cannot stop admitting (issue #43): a descriptor of a listener closed
behind its back, as code does that closes a descriptor *number* it does not own (a
connection rebuilt from a bare number, ``os.close(n)``).

The kernel gives the lowest free number to the next socket: before the fix, the stream
listener's gate found that number still in its selector when it accepted the next
connection (``KeyError: 'FD 8 is already registered'``, uncaught), dropped the socket,
and every later job failed its handshake, so no pool could start again and nothing
named why. Now the gate drops the stale entry and listens again on the same address,
or fails what depends on it at once with :class:`fiber.errors.ListenerLostError`.

Real sockets, real local jobs; the closing is done with ``os.close`` on the listener's
own descriptor number, from the program and from a fiber Process.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from fiber.errors import ListenerLostError
from fiber.wire import gate as gate_module
from fiber.wire.gate import Admission, Gate

# -- the gate alone ---------------------------------------------------------------------


def _admitting_gate():
    got: list[socket.socket] = []
    arrived = threading.Event()

    def admitted(sock, admission):
        got.append(sock)
        arrived.set()

    class Opening(Admission):
        """Accepts a connection's first byte (the handshake is not what is tested)."""

        def want(self) -> int:
            return 1

        def received(self, data: bytes) -> bytes:
            self.accepted = True
            return b""

    deaths: list[BaseException] = []
    gate = Gate("test", admitted, on_death=deaths.append)
    return gate, got, arrived, lambda sock: Opening(), deaths


def _connect_and_say(address) -> socket.socket:
    client = socket.create_connection(address, timeout=5)
    client.sendall(b"x")
    return client


def test_a_gate_whose_listening_descriptor_was_closed_listens_again_on_its_address():
    """The issue's case: the listening socket's number is closed and given to the next
    connection the gate accepts (on its other listening socket). Before the fix the
    gate's selector.register raised KeyError on every connection from then on."""
    gate, got, arrived, Opening, deaths = _admitting_gate()
    first = socket.create_server(("127.0.0.1", 0))
    second = socket.create_server(("127.0.0.1", 0))
    renewed: list[tuple[socket.socket, socket.socket]] = []
    gate.listen(first, Opening, lambda old, new: renewed.append((old, new)))
    gate.listen(second, Opening)
    address = first.getsockname()
    clients = []
    try:
        clients.append(_connect_and_say(address))
        assert arrived.wait(5), "the gate did not admit a connection before anything broke"
        arrived.clear()
        number = first.fileno()
        os.close(number)  # behind the listener's back
        # the next connection on the other socket gets that number
        for _ in range(3):
            clients.append(_connect_and_say(second.getsockname()))
            assert arrived.wait(5), (
                "the gate stopped admitting after a listening descriptor was closed")
            arrived.clear()
        # and the lost socket's address works again (a new socket listens there)
        deadline = time.monotonic() + 5
        while not renewed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert renewed, "the gate did not listen again on the lost socket's address"
        assert renewed[0][0] is first and first.fileno() == -1  # detached, never closed
        clients.append(_connect_and_say(address))
        assert arrived.wait(5), "nothing admits connections on the lost socket's address"
        assert not deaths
        assert gate.renewals == 1
    finally:
        gate.close()
        for sock in [*clients, *got, second] + [new for _, new in renewed]:
            sock.close()


def test_a_gate_notices_a_closed_listening_descriptor_within_its_verify_period():
    """Nothing connects: the periodic check still finds the lost socket, and a
    squatter holding the number is never closed by the gate."""
    gate, got, arrived, Opening, deaths = _admitting_gate()
    listening = socket.create_server(("127.0.0.1", 0))
    address = listening.getsockname()
    renewed: list[socket.socket] = []
    gate.listen(listening, Opening, lambda old, new: renewed.append(new))
    time.sleep(0.2)  # (the gate has taken it)
    number = listening.fileno()
    os.close(number)
    squatter = socket.socket()  # takes the number (the lowest free one)
    try:
        assert squatter.fileno() == number
        deadline = time.monotonic() + 3 * gate_module.VERIFY_EVERY
        while not renewed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert renewed, "the lost listening socket was not noticed"
        client = _connect_and_say(address)
        assert arrived.wait(5)
        client.close()
        os.fstat(squatter.fileno())  # still open: the gate did not close its number
    finally:
        gate.close()
        squatter.close()
        for sock in got + renewed:
            sock.close()


def test_a_gate_that_cannot_listen_again_fails_its_owner_naming_the_listener():
    """The address is taken by the time the gate tries again: the owner's on_death
    gets a ListenerLostError naming the listener and the address, and check() raises it."""
    gate, got, arrived, Opening, deaths = _admitting_gate()
    listening = socket.create_server(("127.0.0.1", 0))
    address = listening.getsockname()
    gate.listen(listening, Opening)
    time.sleep(0.2)
    os.close(listening.fileno())
    thief = socket.socket()
    thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    thief.bind(address)  # someone else listens there now
    thief.listen(1)
    try:
        started = time.monotonic()
        with pytest.raises(ListenerLostError, match="test listener"):
            gate.check()
        assert time.monotonic() - started < 10
        assert deaths and isinstance(deaths[0], ListenerLostError)
        assert f"{address[0]}:{address[1]}" in str(deaths[0])
    finally:
        gate.close()
        thief.close()


# -- fiber.connection.Listener and a manager's (or shared objects') server -------------------


def _listening_again(gate) -> None:
    """Wait (at most twice the gate's check period) until the gate listens again."""
    deadline = time.monotonic() + 2 * gate_module.VERIFY_EVERY + 1
    while gate.renewals == 0:
        assert time.monotonic() < deadline, "the listener did not listen again"
        time.sleep(0.05)


def _accept_within(accept, seconds: float):
    box: list = []
    thread = threading.Thread(target=lambda: box.append(accept()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"accept() returned nothing within {seconds:g} s"
    return box[0]


def test_a_fiber_listener_whose_descriptor_was_closed_still_accepts_clients():
    from fiber.connection import Client, Listener

    with Listener(("127.0.0.1", 0)) as listener:
        os.close(listener._listener._socket.fileno())  # behind its back
        squatter = socket.socket()  # its number is someone else's now
        _listening_again(listener._gate)
        with Client(listener.address) as client:
            conn = _accept_within(listener.accept, 10)
            client.send("after")
            assert conn.recv() == "after"
            conn.close()
        os.fstat(squatter.fileno())  # never closed by the listener
        squatter.close()


def test_a_manager_listener_whose_descriptor_was_closed_still_admits_proxies():
    from fiber.runtime.managers import connection

    key = os.urandom(32)
    listener = connection.Listener(("127.0.0.1", 0))
    listener.admit(key)
    try:
        time.sleep(0.2)  # (its gate has taken the socket)
        os.close(listener._sock.fileno())
        _listening_again(listener._gate)
        client = connection.Client(listener.address, authkey=key)
        conn = _accept_within(listener.accept, 10)
        client.send("after")
        assert conn.recv() == "after"
        conn.close()
        client.close()
    finally:
        listener.close()


# -- a whole program ----------------------------------------------------------------------

PROGRAM = """
import os, socket, sys, time
import fiber
from fiber.runtime import run

def square(x):
    return x * x

def lose(which):
    '''Close this process's stream listener's {which} socket behind its back, then
    start a pool: it works, or raises naming the listener, within 10 s.'''
    with fiber.Pool(2) as pool:
        assert pool.map(square, range(4)) == [0, 1, 4, 9]
    stream = run.hub()._stream
    sock = stream._sock if which == "tcp" else stream._local
    os.close(sock.fileno())
    started = time.monotonic()
    try:
        with fiber.Pool(2) as pool:
            got = pool.map(square, range(20))
        outcome = "works" if got == [x * x for x in range(20)] else f"wrong {got}"
    except Exception as exc:
        outcome = f"raised {type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - started

def report(which, queue):
    queue.put(lose(which))

if __name__ == "__main__":
    where = sys.argv[1]
    for which in ("tcp", "local"):
        if where == "program":
            outcome, took = lose(which)
        else:  # in a fiber Process started by the program (pool workers are daemons)
            queue = fiber.SimpleQueue()
            child = fiber.Process(target=report, args=(which, queue))
            child.start()
            outcome, took = queue.get()
            child.join()
        print(f"RESULT {which} {took:.1f} {outcome}", flush=True)
"""


@pytest.mark.parametrize("where", ["program", "task"])
def test_a_pool_starts_after_a_stream_listener_descriptor_was_closed(tmp_path, where):
    """From the program and from a task (a fiber Process running pools of its own):
    the stream listener's TCP socket, then its Unix socket, closed behind its back;
    the next pool works (or raises naming the listener) within 10 s."""
    import subprocess
    import sys

    script = tmp_path / "main.py"
    script.write_text(PROGRAM)
    proc = subprocess.run([sys.executable, str(script), where], capture_output=True,
                          text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "FIBER_BACKEND": "local"})
    results = [line.split(" ", 3)[1:] for line in proc.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == 2, proc.stdout + proc.stderr[-4000:]
    for which, took, outcome in results:
        assert float(took) < 10, (which, took, outcome)
        assert outcome == "works" or ("stream listener" in outcome
                                      and "ListenerLostError" in outcome), (which, outcome)
    assert "KeyError" not in proc.stderr, proc.stderr[-4000:]
