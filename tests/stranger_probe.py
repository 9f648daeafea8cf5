"""A stranger's probes of fiber's listening sockets, shared by the stranger tests
(tests/core/test_stranger.py on the local backend, tests/ssh/test_stranger.py from
another host): finding a program's listening sockets from /proc, the probes a port
scanner or a hostile user could send, and a legitimate client's handshake.

Run as a program (``python stranger_probe.py PROBE KIND ADDRESS [KEY]``), it runs one
probe and prints its outcome as JSON: the ssh test runs it inside a test host's network
namespace, so that the stranger is another host.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MIB = 1 << 20
DEADLINE = 10.0  # fiber.wire.gate.DEADLINE and the hub's AUTH_TIMEOUT
HOLD = 500  # connections held at once


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# -- what the OS says ---------------------------------------------------------------------
def family_tree(root: int) -> set[int]:
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


def _ipv4(hex_address: str) -> str:
    return socket.inet_ntop(socket.AF_INET, struct.pack("<I", int(hex_address, 16)))


def _ipv6(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    return socket.inet_ntop(socket.AF_INET6, b"".join(
        raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets(pids: set[int]) -> list[tuple[str, object, int]]:
    """(kind, address, owner pid) of every listening TCP and abstract Unix socket held
    by one of ``pids``, from /proc (each process's own network namespace's tables)."""
    owner: dict[str, int] = {}
    for pid in sorted(pids):
        for inode in _socket_inodes(pid):
            owner.setdefault(inode, pid)
    found: dict[tuple[str, object], int] = {}
    for pid in sorted(pids):
        for table, decode in (("tcp", _ipv4), ("tcp6", _ipv6)):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] != "0A" or fields[9] not in owner:  # 0A: LISTEN
                        continue
                    host, port = fields[1].rsplit(":", 1)
                    found.setdefault(("tcp", (decode(host), int(port, 16))),
                                     owner[fields[9]])
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/unix") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                # flags 00010000: listening; a path starting with @: abstract
                if (len(fields) >= 8 and fields[3] == "00010000" and fields[6] in owner
                        and fields[7].startswith("@")):
                    found.setdefault(("unix", "\0" + fields[7][1:]), owner[fields[6]])
    return [(kind, address, pid) for (kind, address), pid in found.items()]


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


def connect(kind: str, address: object, timeout: float = 5.0) -> socket.socket:
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        host = address[0]  # type: ignore[index]
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.settimeout(timeout)
    sock.connect(address)  # type: ignore[arg-type]
    return sock


def closed_by_peer(sock: socket.socket, within: float) -> bool:
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


def flood(kind: str, address: object, total: int) -> None:
    """Send ``total`` bytes of garbage in one connection (stops when it is closed)."""
    chunk = os.urandom(MIB)
    with contextlib.suppress(OSError), connect(kind, address) as sock:
        sock.settimeout(20)
        sent = 0
        while sent < total:
            sock.sendall(chunk)
            sent += len(chunk)


def trickle(kind: str, address: object) -> float:
    """One byte a second of a well-formed stream handshake frame; how long until the
    program closes the connection."""
    start = time.monotonic()
    frame = struct.pack("<QI", 34, 0) + b"A1" + b"\0" * 32
    try:
        with connect(kind, address) as sock:
            for byte in frame:
                sock.send(bytes([byte]))
                if closed_by_peer(sock, 1.0):
                    break
                if time.monotonic() - start > 3 * DEADLINE:
                    break
    except OSError:
        pass
    return time.monotonic() - start


def legitimate(kind: str, address: object, key: bytes, listener: object = None) -> str:
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
    with connect(kind, address) as probe:
        probe.settimeout(0.5)
        try:
            first = probe.recv(64)
        except TimeoutError:
            first = b""
    if first[4:15] == b"#CHALLENGE#":
        with mpc.Client((host, port), authkey=key) as conn:
            if listener is not None and [host, port] == list(listener):
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


def rude(kind: str, address: object, marker: str) -> list[str]:
    """Huge length prefixes in every framing, garbage and rogue pickles, each on a
    connection of its own; what the program did not close within the deadline."""
    kept = []
    exploit = pickle.dumps(_Exploit(marker))
    messages = [*_huge_prefixes(), os.urandom(MIB), *_framings(exploit),
                *_framings(b"M" + struct.pack("<Q", 1) + exploit)]
    for data in messages:
        with connect(kind, address) as sock:
            _send_quietly(sock, data)
            if not closed_by_peer(sock, DEADLINE + 5):
                kept.append(data[:16].hex())
    return kept


def hold(kind: str, address: object, seconds: float, key: bytes | None = None,
         listener: object = None) -> dict:
    """Hold :data:`HOLD` connections for ``seconds``; with ``key``, check meanwhile that
    a legitimate client still gets in."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    held = []
    for _ in range(HOLD):
        with contextlib.suppress(OSError):
            held.append(connect(kind, address))
    time.sleep(seconds)
    got_in = legitimate(kind, address, key, listener) if key else None
    for sock in held:
        sock.close()
    return {"held": len(held), "legitimate": got_in}


def replay(kind: str, address: object, key: bytes) -> bool:
    """A recorded proof of the secret (for another challenge) sent on a new stream
    connection: True when the program refused it (closed the connection)."""
    from fiber.wire import auth
    from fiber.wire.protocol import AUTH1, AUTH3, CLIENT_ROLE, NONCE_SIZE
    nonce = auth.new_nonce()
    recorded = AUTH3 + auth.answer(key, CLIENT_ROLE, b"\0" * NONCE_SIZE)
    with connect(kind, address) as sock:
        sock.sendall(struct.pack("<QI", 2 + NONCE_SIZE, 0) + AUTH1 + nonce)
        sock.recv(12 + 1 + NONCE_SIZE + 32)
        sock.sendall(struct.pack("<QI", len(recorded), 0) + recorded)
        return closed_by_peer(sock, 5)


class PidsLimit:
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


def rounds(path: Path, since: float, until: float) -> list[float]:
    out = []
    for line in path.read_text().splitlines():
        at, took = map(float, line.split())
        if since <= at <= until:
            out.append(took)
    return out


class Windows:
    """Alternating spans of time, quiet or probed, so that the program's undisturbed
    rounds are sampled across the whole probing rather than only before it: the
    machine's background load changes from one 5 s window to the next (round medians of
    1.4 to 7.6 ms in one run under scripts/load), and a baseline taken only at the start
    made the ratio a matter of luck (issue #44). ``quiet(seconds)`` sleeps that long as
    a quiet span; ``probing()`` is a context manager around probes."""

    def __init__(self) -> None:
        self.spans: dict[str, list[tuple[float, float]]] = {"quiet": [], "probed": []}

    def quiet(self, seconds: float) -> None:
        began = time.time()
        time.sleep(seconds)
        self.spans["quiet"].append((began, time.time()))

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        began = time.time()
        try:
            yield
        finally:
            self.spans["probed"].append((began, time.time()))

    def rounds(self, path: Path, which: str) -> list[float]:
        """The round times of ``path`` that fall in the ``which`` spans."""
        return [took for since, until in self.spans[which]
                for took in rounds(path, since, until)]


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]




def main(argv: list[str]) -> int:
    """``PROBE KIND ADDRESS [KEY_HEX LISTENER_JSON]``: run one probe, print its outcome."""
    probe, kind = argv[0], argv[1]
    address: object = json.loads(argv[2])
    address = tuple(address) if isinstance(address, list) else address
    key = bytes.fromhex(argv[3]) if len(argv) > 3 and probe != "rude" else None
    listener = json.loads(argv[4]) if len(argv) > 4 else None
    if probe == "rude":
        outcome: object = rude(kind, address, argv[3])
    elif probe == "flood":
        flood(kind, address, 128 * MIB)
        outcome = True
    elif probe == "hold":
        outcome = hold(kind, address, 1.0, key, listener)
    elif probe == "trickle":
        outcome = trickle(kind, address)
    elif probe == "replay":
        outcome = replay(kind, address, key)  # type: ignore[arg-type]
    elif probe == "legitimate":
        outcome = legitimate(kind, address, key, listener)  # type: ignore[arg-type]
    else:
        raise SystemExit(f"unknown probe {probe!r}")
    print(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
