"""Handles travel as handles (issue #43): a multiprocessing Connection, a fiber
Connection, a socket and a file descriptor (``fiber.reduction.DupFd``) sent to another
fiber process are duplicated into it (``SCM_RIGHTS`` through the sender's handle
sharer, :mod:`fiber.wire.handles`), never pickled as a bare number; refused with
:class:`fiber.errors.HandleError` where the receiver does not share the kernel and
network namespace.

Each direction (to a child Process, to a pool worker, back to the parent) is one real
program on the local backend that sends every kind; each handle is used by the
receiver to reach its peer in the sender, and the sender closes its own copy right
after sending (as multiprocessing allows), so the peer's EOF proves the receiver's copy
was the last one (nothing kept or leaked a duplicate). Every descriptor the sender and
the receiver had before is checked to be still open and the same after.

Before (1e32018) a multiprocessing Connection was pickled as its number (the receiver
wrapped whatever it had under that number; closing it broke the program's listeners),
a socket and ``DupFd`` were refused.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

COMMON = '''
import os, socket, sys, threading, time
import fiber
from fiber.connection import Client, Listener
from fiber.reduction import DupFd


def descriptors():
    """This process's descriptors: number -> what it is (a socket, a pipe, a file)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def unchanged(before, after, what):
    """Every descriptor of ``before`` is still open and the same object."""
    for fd, target in before.items():
        if after.get(fd) != target:
            raise AssertionError(f"{what}: descriptor {fd} was {target}, now "
                                 f"{after.get(fd, 'closed')}")


def make_kinds():
    """One of each kind: (name, handle to send, the peer kept here, how to read it)."""
    kinds = []
    listener = Listener(("127.0.0.1", 0))
    box = []
    thread = threading.Thread(target=lambda: box.append(Client(listener.address)))
    thread.start()
    accepted = listener.accept()
    thread.join()
    listener.close()
    kinds.append(("mp_connection", accepted, box[0]))
    a, b = fiber.Pipe()
    kinds.append(("fiber_connection", a, b))
    s1, s2 = socket.socketpair()
    kinds.append(("socket", s1, s2))
    r, w = os.pipe()
    kinds.append(("fd", w, r))
    return kinds


def to_send(name, handle):
    return DupFd(handle) if name == "fd" else handle


def use(name, handle):
    """The receiver's side: say who we are on the handle, then close it."""
    word = f"{name} from {os.getpid()}"
    if name in ("mp_connection", "fiber_connection"):
        handle.send(word)
        handle.close()
    elif name == "socket":
        handle.sendall(word.encode())
        handle.close()
    else:
        fd = handle.detach()
        os.write(fd, word.encode())
        os.close(fd)
    return word


def close_own(name, handle):
    """The sender closes its own copy right after sending."""
    if name == "fd":
        os.close(handle)
    else:
        handle.close()


def read_peer(name, peer):
    """What the receiver said, then the EOF its close gives (the last copy closed)."""
    if name in ("mp_connection", "fiber_connection"):
        got = peer.recv()
        try:
            peer.recv()
            return got, "no EOF"
        except EOFError:
            return got, "EOF"
    if name == "socket":
        peer.settimeout(20)
        data = b""
        while True:
            chunk = peer.recv(4096)
            if not chunk:
                return data.decode(), "EOF"
            data += chunk
    data = b""
    while True:
        chunk = os.read(peer, 4096)
        if not chunk:
            return data.decode(), "EOF"
        data += chunk


def square(x):
    return x * x
'''

TO_CHILD = COMMON + '''
def child(queue, report):
    before = descriptors()
    results = []
    for _ in range(4):
        name, handle = queue.get()
        results.append((name, use(name, handle)))
    unchanged(before, descriptors(), "the receiver")
    report.put(results)


if __name__ == "__main__":
    kinds = make_kinds()
    queue, report = fiber.SimpleQueue(), fiber.SimpleQueue()
    proc = fiber.Process(target=child, args=(queue, report))
    proc.start()
    sent = {handle if name == "fd" else handle.fileno() for name, handle, _ in kinds
            if name != "fiber_connection"}
    before = descriptors()
    for name, handle, peer in kinds:
        queue.put((name, to_send(name, handle)))
        close_own(name, handle)
    said = dict(report.get())
    for name, handle, peer in kinds:
        got, end = read_peer(name, peer)
        print("KIND", name, got == said[name] and got.startswith(name), end, flush=True)
    # (while the child lives: its own connections to this process close with it)
    unchanged({fd: t for fd, t in before.items() if fd not in sent}, descriptors(),
              "the sender")
    proc.join()
    with fiber.Pool(2) as pool:
        print("POOL", pool.map(square, range(5)) == [0, 1, 4, 9, 16], flush=True)
'''

TO_WORKER = COMMON + '''
def task(name, handle):
    # (received with the task's arguments: its own descriptor is the one use() closes)
    own = handle.fileno() if name in ("mp_connection", "socket") else None
    before = {fd: t for fd, t in descriptors().items() if fd != own}
    word = use(name, handle)
    unchanged(before, descriptors(), "the receiver")
    return word


if __name__ == "__main__":
    kinds = make_kinds()
    with fiber.Pool(2) as pool:
        results = [(name, pool.apply_async(task, (name, to_send(name, handle))), peer,
                    handle) for name, handle, peer in kinds]
        for name, result, peer, handle in results:
            said = result.get(60)
            close_own(name, handle)
            got, end = read_peer(name, peer)
            print("KIND", name, got == said and got.startswith(name), end, flush=True)
    with fiber.Pool(2) as pool:
        print("POOL", pool.map(square, range(5)) == [0, 1, 4, 9, 16], flush=True)
'''

TO_PARENT = COMMON + '''
def child(queue, done):
    kinds = make_kinds()
    sent = {handle if name == "fd" else handle.fileno() for name, handle, _ in kinds
            if name != "fiber_connection"}
    before = descriptors()
    for name, handle, peer in kinds:
        queue.put((name, to_send(name, handle)))
        close_own(name, handle)
    for name, handle, peer in kinds:
        got, end = read_peer(name, peer)
        queue.put(("read", name, got, end))
    unchanged({fd: t for fd, t in before.items() if fd not in sent}, descriptors(),
              "the sender")
    done.get()


if __name__ == "__main__":
    queue, done = fiber.SimpleQueue(), fiber.SimpleQueue()
    proc = fiber.Process(target=child, args=(queue, done))
    proc.start()
    before = descriptors()
    said = {}
    for _ in range(4):
        name, handle = queue.get()
        said[name] = use(name, handle)
    unchanged(before, descriptors(), "the receiver")
    for _ in range(4):
        _, name, got, end = queue.get()
        print("KIND", name, got == said[name] and got.startswith(name), end, flush=True)
    done.put(None)
    proc.join()
    with fiber.Pool(2) as pool:
        print("POOL", pool.map(square, range(5)) == [0, 1, 4, 9, 16], flush=True)
'''

KINDS = ["mp_connection", "fiber_connection", "socket", "fd"]


@pytest.mark.parametrize("direction", ["to_child", "to_worker", "to_parent"])
def test_each_kind_of_handle_travels_as_a_handle(tmp_path, direction):
    program = {"to_child": TO_CHILD, "to_worker": TO_WORKER, "to_parent": TO_PARENT}[direction]
    script = tmp_path / "main.py"
    script.write_text(program)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env={**os.environ, "FIBER_BACKEND": "local"})
    out = proc.stdout + proc.stderr[-4000:]
    assert proc.returncode == 0, out
    kinds = {line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines()
             if line.startswith("KIND ")}
    assert sorted(kinds) == sorted(KINDS), out
    for name, (same, end) in kinds.items():
        assert same == "True", (name, out)  # the receiver's words reached the peer
        assert end == "EOF", (name, out)  # and its close was the last copy's
    assert "POOL True" in proc.stdout, out


def test_a_connection_sent_to_a_child_and_closed_there_leaves_pools_working(run_script):
    """The issue's program: a Listener's connection sent to a child, closed there."""
    result = run_script("""
        import threading, time
        import fiber
        from fiber.connection import Client, Listener

        def child(conn):
            c = conn.recv()
            c.close()

        def square(x):
            return x * x

        if __name__ == "__main__":
            listener = Listener()
            box = []
            thread = threading.Thread(target=lambda: box.append(Client(listener.address)))
            thread.start()
            accepted = listener.accept()
            thread.join()
            for _ in range(2):
                a, b = fiber.Pipe()
                p = fiber.Process(target=child, args=(b,))
                p.start()
                a.send(accepted)
                p.join()
                assert p.exitcode == 0, p.exitcode
                started = time.monotonic()
                with fiber.Pool(2) as pool:
                    assert pool.map(square, range(4)) == [0, 1, 4, 9]
                print("POOL", round(time.monotonic() - started, 1), flush=True)
            accepted.send("still ours")  # the parent's own connection is intact
            print("PEER", box[0].recv())
    """, env={"FIBER_BACKEND": "local"}, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    assert result.stdout.count("POOL") == 2, result.stdout + result.stderr[-4000:]
    assert "PEER still ours" in result.stdout
    assert "KeyError" not in result.stderr and "Bad file descriptor" not in result.stderr


def test_a_handle_is_refused_in_another_network_namespace(tmp_path):
    """A receiver that cannot reach the sender's kernel and namespace: a real process
    in a new network namespace (``unshare --net``, root only) unpickles a socket sent
    from here and gets HandleError saying why, not a descriptor number."""
    if os.geteuid() != 0:
        pytest.skip("unshare --net needs root")
    import socket

    from fiber.wire import serialization

    s1, s2 = socket.socketpair()
    body = serialization.dumps(s1)
    (tmp_path / "body").write_bytes(body)
    code = textwrap.dedent(f"""
        from fiber.errors import HandleError
        from fiber.wire import serialization
        try:
            serialization.loads(open({str(tmp_path / 'body')!r}, 'rb').read())
        except HandleError as exc:
            print("REFUSED", exc)
        else:
            print("RECEIVED")
    """)
    proc = subprocess.run(["unshare", "--net", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=60)
    s1.close()
    s2.close()
    assert "REFUSED" in proc.stdout, proc.stdout + proc.stderr
    assert "another machine" in proc.stdout and "network namespace" in proc.stdout


def test_plain_pickle_still_refuses_a_socket():
    """Sockets are shared on fiber's wire only: pickle.dumps refuses one as without fiber."""
    import pickle
    import socket

    import fiber.wire.serialization  # noqa: F401 - its reducers registered

    with socket.socket() as sock, pytest.raises(TypeError):
        pickle.dumps(sock)


def test_the_handle_sharer_gives_nothing_to_a_stranger():
    """The sharer's abstract socket is reachable by any process of the namespace: a
    peer that announces a huge frame, or answers the challenge with another secret, is
    closed without a descriptor, and the handle still reaches its real receiver."""
    import socket
    import struct

    from fiber.errors import AuthenticationError
    from fiber.wire import handles, serialization
    from fiber.wire.handshake import prove

    s1, s2 = socket.socketpair()
    body = serialization.dumps(s1)
    address = "\0" + handles.sharer_address()
    try:
        with socket.socket(socket.AF_UNIX) as stranger:
            stranger.settimeout(5)
            stranger.connect(address)
            stranger.sendall(struct.pack("!I", 0xFFFFFFFF))  # 4 GiB announced
            passed = []
            while True:  # (a refusal frame may come before the close)
                msg, fds, _, _ = socket.recv_fds(stranger, 4096, 1)
                passed += fds
                if not msg:
                    break
            assert passed == []  # closed, nothing passed
        with socket.socket(socket.AF_UNIX) as stranger:
            stranger.settimeout(5)
            stranger.connect(address)

            def exchange(message: bytes) -> bytes:
                stranger.sendall(struct.pack("!I", len(message)) + message)
                size = struct.unpack("!I", stranger.recv(4))[0]
                return stranger.recv(size)

            with pytest.raises((AuthenticationError, OSError, struct.error)):
                prove(b"not the run's secret" * 2, exchange, "the sharer")
            stranger.shutdown(socket.SHUT_WR)  # (gives up: the sharer closes too)
            passed = []
            while True:
                msg, fds, _, _ = socket.recv_fds(stranger, 4096, 1)
                passed += fds
                if not msg:
                    break
            assert passed == []
        received = serialization.loads(body)  # the real receiver still gets it
        received.sendall(b"z")
        assert s2.recv(1) == b"z"
        received.close()
    finally:
        s1.close()
        s2.close()
