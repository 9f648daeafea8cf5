"""A stranger probes a running fiber program on every socket it and its jobs listen on.

The program (tests/core/stranger_target.py: a Pool, a Manager, a shared Lock and Value,
a Listener) works in rounds while the test, holding no secret, sends what a port
scanner or a hostile user of the machine could: huge length prefixes in every framing
fiber speaks, garbage, rogue pickles, 128 MiB of unauthenticated data, 500 held
connections, a one-byte-a-second trickle and a replayed handshake, then the held
connections again under a limit on the program's threads (a pids cgroup). The sockets
are found from the operating system (/proc), not from fiber's bookkeeping; the only
thing read from the program is its secret, to check that legitimate clients still get
in. Nothing is faked: real sockets against the real program on the local backend.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MIB = 1 << 20
DEADLINE = 10.0  # fiber.wire.gate.DEADLINE and the hub's AUTH_TIMEOUT


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- what the OS says ---------------------------------------------------------------------
def _family_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def listening_sockets(root: int) -> list[tuple[str, object, int]]:
    """(kind, address, owner pid) of every listening TCP and abstract Unix socket of
    ``root`` and its descendants, from /proc."""
    owner = {}
    for pid in _family_tree(root):
        for inode in _socket_inodes(pid):
            owner.setdefault(inode, pid)
    found: list[tuple[str, object, int]] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN
                    continue
                port = int(fields[1].rsplit(":", 1)[1], 16)
                host = "127.0.0.1" if table.endswith("tcp") else "::1"
                found.append(("tcp", (host, port), owner[fields[9]]))
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            # flags 00010000: __SO_ACCEPTCON (listening); a path starting with @: abstract
            if (len(fields) >= 8 and fields[3] == "00010000" and fields[6] in owner
                    and fields[7].startswith("@")):
                found.append(("unix", "\0" + fields[7][1:], owner[fields[6]]))
    return found


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def _connect(kind: str, address: object, timeout: float = 5.0) -> socket.socket:
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        host = address[0]  # type: ignore[index]
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(timeout)
    sock.connect(address)  # type: ignore[arg-type]
    return sock


def _closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the program closes ``sock`` within ``within`` seconds (what it sends
    before is read and dropped)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        sock.settimeout(max(0.05, end - time.monotonic()))
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True
    return False


# -- the probes ------------------------------------------------------------------------------
NNG_REQ_HEADER = b"\x00SP\x00\x00\x30\x00\x00"  # nng's TCP handshake of a Req0 socket


def _framings(body: bytes) -> list[bytes]:
    """``body`` as each of fiber's wires would frame a message: nng (SP header, 8-byte
    length, request id), stream (8-byte length, line), multiprocessing (4-byte length),
    and bare."""
    request = struct.pack(">I", 0x80000001) + body
    return [NNG_REQ_HEADER + struct.pack(">Q", len(request)) + request,
            struct.pack("<QI", len(body), 1) + body,
            struct.pack("!i", len(body)) + body,
            body]


def _huge_prefixes() -> list[bytes]:
    sixteen_gib = 16 << 30
    return [NNG_REQ_HEADER + struct.pack(">Q", sixteen_gib),
            struct.pack("<QI", sixteen_gib, 1),
            struct.pack("!i", 0x7FFFFFFF),
            struct.pack("!iQ", -1, sixteen_gib)]


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(data)


def _flood(kind: str, address: object, total: int) -> None:
    """Send ``total`` bytes of garbage in one connection (stops when it is closed)."""
    chunk = os.urandom(MIB)
    with contextlib.suppress(OSError), _connect(kind, address) as sock:
        sock.settimeout(20)
        sent = 0
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)


def _trickle(kind: str, address: object, results: dict, key: object) -> None:
    """One byte a second of a well-formed stream handshake frame; how long until the
    program closes the connection."""
    start = time.monotonic()
    frame = struct.pack("<QI", 34, 0) + b"A1" + b"\0" * 32
    try:
        with _connect(kind, address) as sock:
            for byte in frame:
                sock.send(bytes([byte]))
                if _closed_by_peer(sock, 1.0):
                    break
                if time.monotonic() - start > 3 * DEADLINE:
                    break
    except OSError:
        pass
    results[key] = time.monotonic() - start


def _legitimate(kind: str, address: object, key: bytes, listener: tuple) -> str:
    """Connect as a process of the run would, with whichever of fiber's handshakes the
    socket speaks; the protocol that got in."""
    import multiprocessing.connection as mpc

    from fiber.errors import AuthenticationError, ConnectionLostError
    from fiber.wire.nng_client import Client
    from fiber.wire.stream.client import StreamClient

    if kind == "unix":
        name = address[1:]  # type: ignore[index]
        StreamClient(f"stream://127.0.0.1:1?local={name}", authkey=key).close()
        return "stream (unix)"
    host, port = address  # type: ignore[misc]
    # a server that speaks first is multiprocessing's challenge
    with _connect(kind, address) as probe:
        probe.settimeout(0.5)
        try:
            first = probe.recv(64)
        except TimeoutError:
            first = b""
    if first[4:15] == b"#CHALLENGE#":
        with mpc.Client((host, port), authkey=key) as conn:
            if [host, port] == list(listener):
                conn.send("ping")
                assert conn.recv() == ("pong", "ping")
        return "multiprocessing"
    try:
        StreamClient(f"stream://{host}:{port}", authkey=key).close()
        return "stream"
    except (AuthenticationError, ConnectionLostError, OSError):
        pass
    Client(f"tcp://{host}:{port}", authkey=key).close()
    return "nng"


class _PidsLimit:
    """A pids cgroup (v1) around the program: a real limit on its threads."""

    root = Path("/sys/fs/cgroup/pids")

    def __init__(self) -> None:
        self.path = self.root / f"fiber-stranger-{os.getpid()}"

    def available(self) -> bool:
        return self.root.is_dir() and os.access(self.root, os.W_OK)

    def limit(self, pids: set[int], headroom: int) -> None:
        self.path.mkdir(exist_ok=True)
        for pid in pids:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.procs").write_text(str(pid))
        current = int((self.path / "pids.current").read_text())
        (self.path / "pids.max").write_text(str(current + headroom))

    def lift(self) -> None:
        with contextlib.suppress(OSError):
            (self.path / "pids.max").write_text("max")

    def remove(self) -> None:
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


def _rounds(path: Path, since: float, until: float) -> list[float]:
    out = []
    for line in path.read_text().splitlines():
        at, took = map(float, line.split())
        if since <= at <= until:
            out.append(took)
    return out


def _median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


@pytest.fixture
def program(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    env = dict(os.environ, FIBER_BACKEND="local")
    proc = subprocess.Popen([sys.executable, str(HERE / "stranger_target.py"),
                             str(tmp_path)], env=env, start_new_session=True)
    cgroup = _PidsLimit()
    try:
        ready = tmp_path / "ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, "the target program ended before it was ready"
            assert time.monotonic() < deadline, "the target program did not get ready"
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        yield proc, info, tmp_path, cgroup
    finally:
        cgroup.lift()
        (tmp_path / "stop").touch()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        cgroup.remove()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stranger_cannot_hurt_a_running_program(program):
    proc, info, out, cgroup = program
    key = bytes.fromhex(info["key"])
    marker = out / "pwned"
    rounds_file = out / "rounds.txt"
    time.sleep(3)  # rounds nobody disturbs
    quiet_until = time.time()
    sockets = listening_sockets(proc.pid)
    kinds = {kind for kind, _, _ in sockets}
    # the hub (nng), its stream listener (TCP and abstract Unix), the manager's server
    # (in its job) and the Listener at least
    assert kinds == {"tcp", "unix"} and len(sockets) >= 5, sockets
    report: dict[str, dict[str, float]] = {}

    for kind, address, owner in sockets:
        name = f"{kind} {address!r} (pid {owner})"
        base_rss, base_threads = _rss(owner), _threads(owner)
        figures = report.setdefault(name, {})
        # huge length prefixes in every framing: closed, nothing allocated
        for prefix in _huge_prefixes():
            with _connect(kind, address) as sock:
                _send_quietly(sock, prefix)
                assert _closed_by_peer(sock, DEADLINE + 5), f"{name} kept {prefix!r}"
        # garbage, and rogue pickles in each framing
        for data in [os.urandom(MIB), *_framings(pickle.dumps(_Exploit(str(marker)))),
                     *_framings(b"M" + struct.pack("<Q", 1) + pickle.dumps(
                         _Exploit(str(marker))))]:
            with _connect(kind, address) as sock:
                _send_quietly(sock, data)
                assert _closed_by_peer(sock, DEADLINE + 5), f"{name} kept garbage"
        # 128 MiB of unauthenticated data, with the owner's memory watched meanwhile
        peak = [base_rss]
        flooding = threading.Thread(target=_flood, args=(kind, address, 128 * MIB))
        flooding.start()
        while flooding.is_alive():
            peak[0] = max(peak[0], _rss(owner))
            flooding.join(0.02)
        figures["flood_rss_growth_mib"] = (peak[0] - base_rss) / MIB
        # 500 held connections: no thread each
        held = []
        for _ in range(500):
            with contextlib.suppress(OSError):
                held.append(_connect(kind, address))
        time.sleep(0.5)
        figures["threads_with_500_held"] = _threads(owner) - base_threads
        figures["held_rss_growth_mib"] = (_rss(owner) - base_rss) / MIB
        assert _legitimate(kind, address, key, info["listener"])  # while they are held
        for sock in held:
            sock.close()
        assert figures["flood_rss_growth_mib"] < 16, (name, figures)
        assert figures["held_rss_growth_mib"] < 16, (name, figures)
        assert figures["threads_with_500_held"] < 5, (name, figures)

    # a trickle of one byte a second on every socket at once: closed at the deadline
    trickles: dict = {}
    threads = [threading.Thread(target=_trickle, args=(kind, address, trickles, i))
               for i, (kind, address, _) in enumerate(sockets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(4 * DEADLINE)
    assert max(trickles.values()) < DEADLINE + 4, trickles

    # a replayed handshake: the proof of one connection opens no other
    from fiber.wire import auth
    from fiber.wire.protocol import AUTH1, AUTH3, CLIENT_ROLE, NONCE_SIZE
    for kind, address, _ in sockets:
        if kind != "unix":
            continue
        with _connect(kind, address) as sock:
            nonce = auth.new_nonce()
            sock.sendall(struct.pack("<QI", 2 + NONCE_SIZE, 0) + AUTH1 + nonce)
            sock.recv(12 + 1 + NONCE_SIZE + 32)
            recorded = AUTH3 + auth.answer(key, CLIENT_ROLE, b"\0" * NONCE_SIZE)
        with _connect(kind, address) as sock:
            sock.sendall(struct.pack("<QI", 2 + NONCE_SIZE, 0) + AUTH1 + nonce)
            sock.recv(12 + 1 + NONCE_SIZE + 32)
            sock.sendall(struct.pack("<QI", len(recorded), 0) + recorded)
            assert _closed_by_peer(sock, 5), "a replayed proof was not refused"

    # the held connections again, under a limit on the program's threads
    if cgroup.available():
        cgroup.limit(_family_tree(proc.pid), headroom=40)
        try:
            for kind, address, _ in sockets:
                held = []
                for _ in range(500):
                    with contextlib.suppress(OSError):
                        held.append(_connect(kind, address))
                assert _legitimate(kind, address, key, info["listener"])
                for sock in held:
                    sock.close()
            time.sleep(1)
            assert proc.poll() is None
        finally:
            cgroup.lift()
    probed_until = time.time()

    # every socket still lets the run in, nothing ran, the program's work went on
    for kind, address, _ in sockets:
        assert _legitimate(kind, address, key, info["listener"])
    assert not marker.exists()
    quiet = _rounds(rounds_file, 0, quiet_until)
    probed = _rounds(rounds_file, quiet_until, probed_until)
    assert len(quiet) >= 5 and len(probed) >= 5
    ratio = _median(probed) / _median(quiet)
    (out / "stop").touch()
    assert proc.wait(60) == 0
    assert (out / "done").exists()
    print(json.dumps({"sockets": len(sockets), "figures": report, "trickle_s": trickles,
                      "round_ratio": ratio}, indent=1, default=str))
    assert ratio < 1.5, (ratio, _median(probed), _median(quiet))
