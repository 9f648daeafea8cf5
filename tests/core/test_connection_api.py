"""fiber.connection's multiprocessing API on the local backend, with real processes:
Listener/Client (between fiber Processes, with a plain multiprocessing child, AF_UNIX,
a wrong key), ``Connection.fileno()`` readiness (a pipe end whose mailbox is here and
one whose mailbox is in another process), ``select``/``selectors``/``wait`` over a mix
of objects, no thread or descriptor left after close, and the multiprocessing
documentation's Listener/Client and ``wait`` examples run unchanged."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.connection
import os
import re
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fiber
import fiber.connection
from fiber.connection import Client, Listener, Pipe, wait

DOCS = Path(__file__).resolve().parent.parent / "mp_docs"


def _readable(conn, timeout: float = 0.0) -> bool:
    return bool(select.select([conn.fileno()], [], [], timeout)[0])


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- children -------------------------------------------------------------------------

def _serve_once(report):
    """Listen at the default address, report it, answer one client."""
    with Listener() as listener:
        report.send(listener.address)
        with listener.accept() as conn:
            conn.send(("echo", conn.recv(), listener.last_accepted is not None))


def _client(address, family, report):
    with Client(address, family) as conn:
        conn.send("ping")
        report.send(conn.recv())


def _mp_client(address, authkey):
    with multiprocessing.connection.Client(address, authkey=authkey) as conn:
        conn.send(["from multiprocessing", os.getpid()])
        conn.recv()  # wait until the parent has read it


def _send_on_go(go, w):
    """Send one message per "go", then close the end."""
    for message in iter(go.recv, None):
        w.send(message)
    w.close()


def _watch_remote_end(r, report, go):
    """Check the readiness of ``r``, whose mailbox is in the parent, step by step."""
    steps = [_readable(r)]
    go.send("empty checked")
    steps.append(_readable(r, 30))  # the parent sent two messages
    steps.append(r.recv())
    steps.append(_readable(r))  # the second one is still there
    steps.append(r.recv())
    steps.append(_readable(r))  # nothing left
    go.send("drained")
    steps.append(_readable(r, 30))  # the parent closed its end: EOF
    try:
        r.recv()
    except EOFError:
        steps.append("EOF")
    report.send(steps)


def _hold_pipe(report, stop):
    """Create a pipe here, hand one end to the parent, keep the mailbox alive."""
    mine, theirs = Pipe()
    report.send(theirs)
    for message in iter(stop.recv, None):
        mine.send(message)


def _sleep(seconds):
    time.sleep(seconds)


# -- Listener / Client ----------------------------------------------------------------

def test_listener_and_client_between_two_fiber_processes():
    """Both sides are fiber Processes with the defaults: the listener's address is
    where jobs can reach it, and the key is the run's secret, which both have."""
    addr_r, addr_w = Pipe(duplex=False)
    out_r, out_w = Pipe(duplex=False)
    server = fiber.Process(target=_serve_once, args=(addr_w,))
    server.start()
    assert addr_r.poll(60), "the server did not report its address"
    address = addr_r.recv()
    assert address[0] == fiber.runtime.run.listen_host() and address[1] > 0
    client = fiber.Process(target=_client, args=(address, None, out_w))
    client.start()
    assert out_r.poll(60)
    assert out_r.recv() == ("echo", "ping", True)
    client.join(60)
    server.join(60)
    assert (client.exitcode, server.exitcode) == (0, 0)


def test_listener_with_a_plain_multiprocessing_child():
    """A child of the standard library (spawn) connects with the same key."""
    key = b"shared between programs"
    with Listener(("127.0.0.1", 0), authkey=key) as listener:
        assert listener.address[1] > 0
        child = multiprocessing.get_context("spawn").Process(
            target=_mp_client, args=(listener.address, key))
        child.start()
        try:
            with listener.accept() as conn:
                assert isinstance(conn, multiprocessing.connection.Connection)
                assert conn.recv() == ["from multiprocessing", child.pid]
                assert listener.last_accepted[0] == "127.0.0.1"
                conn.send("done")
        finally:
            child.join(60)
    assert child.exitcode == 0


def test_wrong_authkey_raises_authentication_error():
    with Listener(("127.0.0.1", 0), authkey=b"right") as listener:
        failures = []

        def accept():
            try:
                listener.accept()
            except multiprocessing.AuthenticationError as exc:
                failures.append(exc)

        thread = threading.Thread(target=accept)
        thread.start()
        with pytest.raises(multiprocessing.AuthenticationError):
            Client(listener.address, authkey=b"wrong")
        thread.join(30)
    assert len(failures) == 1
    assert fiber.AuthenticationError is multiprocessing.AuthenticationError


def test_default_key_is_the_run_secret():
    """Listener and Client without a key authenticate with the run's secret: a client
    without it (another key) is refused, one with it gets in."""
    from fiber.wire.auth import get_authkey

    with Listener(("127.0.0.1", 0)) as listener:
        results = []

        def accept_two():
            for _ in range(2):
                try:
                    with listener.accept() as conn:
                        results.append(conn.recv())
                except multiprocessing.AuthenticationError:
                    results.append("refused")

        thread = threading.Thread(target=accept_two)
        thread.start()
        with pytest.raises(multiprocessing.AuthenticationError):
            Client(listener.address, authkey=b"not the secret")
        with multiprocessing.connection.Client(listener.address,
                                               authkey=get_authkey()) as conn:
            conn.send("in")
        thread.join(30)
    assert results == ["refused", "in"]


def test_af_unix_listener_and_fiber_child(tmp_path):
    path = str(tmp_path / "listener.sock")
    out_r, out_w = Pipe(duplex=False)
    with Listener(path, "AF_UNIX") as listener:
        assert listener.address == path
        child = fiber.Process(target=_client, args=(path, "AF_UNIX", out_w))
        child.start()
        with listener.accept() as conn:
            assert conn.recv() == "ping"
            conn.send("pong")
        assert out_r.poll(60) and out_r.recv() == "pong"
        child.join(60)
    assert child.exitcode == 0
    assert "AF_UNIX" in fiber.connection.families


def test_names_are_multiprocessings():
    mpc = multiprocessing.connection
    assert fiber.connection.wait is mpc.wait
    assert fiber.connection.families is mpc.families
    assert fiber.connection.deliver_challenge is mpc.deliver_challenge
    assert fiber.connection.answer_challenge is mpc.answer_challenge
    assert issubclass(Listener, mpc.Listener)


def test_challenge_functions_work_over_a_fiber_pipe():
    a, b = Pipe()
    done = []
    thread = threading.Thread(
        target=lambda: done.append(fiber.connection.answer_challenge(b, b"k")))
    thread.start()
    fiber.connection.deliver_challenge(a, b"k")
    thread.join(30)
    assert done == [None]


# -- fileno() readiness ---------------------------------------------------------------

def test_fileno_of_a_local_end_follows_the_messages():
    """The mailbox is in this process; the writer is a child."""
    r, w = Pipe(duplex=False)
    go_r, go_w = Pipe(duplex=False)
    child = fiber.Process(target=_send_on_go, args=(go_r, w))
    child.start()
    w.close()
    try:
        assert r.fileno() == r.fileno() >= 0
        assert not _readable(r)
        go_w.send("one")
        assert _readable(r, 30)
        assert _readable(r)  # level-triggered: still readable until taken
        assert r.recv() == "one"
        assert not _readable(r)
        go_w.send("two")
        go_w.send("three")
        assert _readable(r, 30)
        assert r.recv() == "two"
        assert _readable(r, 30)
        assert r.recv() == "three"
        assert not _readable(r)
        go_w.send(None)  # the child closes its end and ends
        assert _readable(r, 30)
        with pytest.raises(EOFError):
            r.recv()
        assert _readable(r)  # EOF stays readable
    finally:
        child.join(60)
    r.close()
    with pytest.raises(OSError):
        r.fileno()


def test_fileno_of_a_remote_end_follows_the_messages():
    """The reader is a child; the mailbox (and the writer) are here."""
    r, w = Pipe(duplex=False)
    rep_r, rep_w = Pipe(duplex=False)
    go_parent, go_child = Pipe()
    child = fiber.Process(target=_watch_remote_end, args=(r, rep_w, go_child))
    child.start()
    r.close()
    assert go_parent.poll(60) and go_parent.recv() == "empty checked"
    w.send("first")
    w.send("second")
    assert go_parent.poll(60) and go_parent.recv() == "drained"
    w.close()
    assert rep_r.poll(60)
    assert rep_r.recv() == [False, True, "first", True, "second", False, True, "EOF"]
    child.join(60)
    assert child.exitcode == 0


def test_selectors_and_wait_over_a_mix_of_objects():
    """A fiber pipe end, a Process sentinel, a socket, a multiprocessing Connection
    and a raw descriptor in one wait() and one selector."""
    r, w = Pipe()
    sock_a, sock_b = socket.socketpair()
    mp_r, mp_w = multiprocessing.Pipe()
    raw_r, raw_w = os.pipe()
    sleeper = fiber.Process(target=_sleep, args=(1.0,))
    sleeper.start()
    objects = [r, sleeper.sentinel, sock_a, mp_r, raw_r]
    try:
        assert wait(objects, 0) == []
        w.send("x")
        assert wait(objects, 10) == [r]
        with selectors.DefaultSelector() as sel:
            sel.register(r, selectors.EVENT_READ, "fiber")
            sel.register(sock_a, selectors.EVENT_READ, "socket")
            assert [key.data for key, _ in sel.select(0)] == ["fiber"]
            sock_b.send(b"y")
            assert sorted(key.data for key, _ in sel.select(10)) == ["fiber", "socket"]
            r.recv()
            sock_a.recv(1)
            assert sel.select(0) == []
        mp_w.send("z")
        os.write(raw_w, b"!")
        assert set(wait(objects, 10)) == {mp_r, raw_r}
        mp_r.recv()
        os.read(raw_r, 1)
        assert wait(objects, 30) == [sleeper.sentinel]  # the process ended
        sleeper.join(10)
        w.close()  # EOF for r
        assert wait([r, sock_a], 10) == [r]
    finally:
        sleeper.join(30)
        for obj in (r, sock_a, sock_b, mp_r, mp_w):
            obj.close()
        os.close(raw_r)
        os.close(raw_w)


def test_no_thread_or_descriptor_left_after_close():
    """Readiness descriptors (and a remote end's watcher thread) go with their end,
    by close() or when the end is collected."""
    stop_r, stop_w = Pipe(duplex=False)
    rep_r, rep_w = Pipe(duplex=False)
    holder = fiber.Process(target=_hold_pipe, args=(rep_w, stop_r))
    holder.start()
    try:
        assert rep_r.poll(60)
        remote = rep_r.recv()  # an end whose mailbox is in the child
        # private read: an end received from a child has no mailbox here (else it would be a
        # copy)
        assert remote._channel is None
        remote.poll(0)  # the connection to the child's hub exists before counting
        local_a, local_b = Pipe()
        gc.collect()
        fds, threads = _open_fds(), threading.active_count()

        local_a.fileno()
        remote.fileno()
        assert _open_fds() > fds
        assert threading.active_count() == threads + 1  # the remote end's watcher
        stop_w.send("hello")
        assert _readable(remote, 30) and remote.recv() == "hello"
        local_a.close()
        remote.close()
        assert (_open_fds(), threading.active_count()) == (fds, threads)

        local_b.fileno()  # dropped without close(): collected
        del local_b
        gc.collect()
        assert (_open_fds(), threading.active_count()) == (fds, threads)
    finally:
        stop_w.send(None)
        holder.join(60)


# -- the multiprocessing documentation's examples -------------------------------------

def _as_multiprocessing(script: Path, tmp_path: Path) -> Path:
    """The documentation's original: the same script importing multiprocessing."""
    text = script.read_text().replace("from fiber.connection import",
                                      "from multiprocessing.connection import")
    text = text.replace("from fiber import", "from multiprocessing import")
    assert "from fiber" not in text and "import fiber" not in text
    copy = tmp_path / script.name
    copy.write_text(text)
    return copy


def _run(script: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=timeout, cwd=script.parent)


def _port_listening(port: int) -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def _server_and_client(server: Path, client: Path) -> tuple[str, str]:
    """Run the server, then the client once the server listens on port 6000."""
    if _port_listening(6000):
        pytest.skip("port 6000, which the documentation's example uses, is taken")
    proc = subprocess.Popen([sys.executable, str(server)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=server.parent)
    try:
        deadline = time.monotonic() + 60
        while not _port_listening(6000):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.05)
        done = _run(client)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (proc.returncode, err) == (0, ""), err
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    # the client's port differs from run to run
    return re.sub(r"\d+\)$", "PORT)", out, flags=re.M), done.stdout


def test_doc_example_listener_and_client(tmp_path):
    fiber_out = _server_and_client(DOCS / "conn_server.py", DOCS / "conn_client.py")
    mp_out = _server_and_client(_as_multiprocessing(DOCS / "conn_server.py", tmp_path),
                                _as_multiprocessing(DOCS / "conn_client.py", tmp_path))
    assert fiber_out == mp_out
    assert fiber_out[0] == "connection accepted from ('127.0.0.1', PORT)\n"
    assert fiber_out[1].splitlines() == [
        "[2.25, None, 'junk', <class 'float'>]", "b'hello'", "8",
        "array('i', [42, 1729, 0, 0, 0])"]


def test_doc_example_wait(tmp_path):
    """Four processes send ten messages each on pipes; the order of the lines varies
    (with multiprocessing too), the lines do not."""
    fiber_run = _run(DOCS / "conn_wait.py")
    mp_run = _run(_as_multiprocessing(DOCS / "conn_wait.py", tmp_path))
    assert (fiber_run.returncode, fiber_run.stderr) == (0, ""), fiber_run.stderr
    assert mp_run.returncode == 0, mp_run.stderr
    lines = sorted(fiber_run.stdout.splitlines())
    assert lines == sorted(mp_run.stdout.splitlines())
    assert len(lines) == 40 and "(9, 'Process-4')" in lines
