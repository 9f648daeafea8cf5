"""What a job runs first on a host where fiber is not installed: the job stub.

Standard library only, and no import of fiber: the job's interpreter may have nothing
else (Debian's ``/usr/bin/python3``, a fresh ``python3 -m venv --without-pip``). The
parent sends this module's source as the job's command (``python -I -c``, see
:func:`fiber.runtime.ship.plan.command`) and what it ships in the job's environment
(``_FIBER_SHIP``, JSON, no secret). The stub

1. connects to the parent's stream listener (``_FIBER_PARENT``) and proves the run's
   secret with the wire's own handshake (``_FIBER_AUTHKEY``, or the backend's secrets
   file, ``_FIBER_SECRETS_FILE``, which it reads and leaves for fiber's bootstrap);
2. checks that this interpreter can run what the parent packed (its implementation,
   version and ABI tag are the parent's), else tells the parent why (a ``SHIPPING``
   message on the job's control channel: the parent's ``join()`` raises it) and exits;
3. for each archive (the program's code, its packages), uses the host's per-user cache
   (``ship_cache``, default ``<tmp>/fiber-ship-<uid>``: 0700, refused when it is not
   this user's alone): a complete entry ``<cache>/<key>/`` is used as it is; a missing
   one is fetched from the parent by chunks (under an exclusive ``flock`` of
   ``<key>.lock``, so that the jobs of one host fetch it once), its SHA-256 checked,
   unpacked into a temporary directory and renamed into place (a half-written entry
   is never seen); entries are held with a shared lock while a job uses them, and the
   oldest entries no job holds are removed when the cache is over ``ship_cache_size``;
4. puts the code first on ``sys.path`` (then the interpreter's standard library, the
   packages, the host's own site-packages), sets the working directory to the code,
   tells fiber's bootstrap where the parent's paths are here (``_FIBER_SHIPPED``) and
   runs it, as ``python -m fiber.runtime.bootstrap`` would.

Everything the host cannot do (a foreign cache directory, a full disk, a damaged
transfer) is sent to the parent as one line saying what to do, within seconds.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import json
import os
import runpy
import shutil
import socket
import stat
import struct
import sys
import sysconfig
import tarfile
import tempfile
import time

SHIP_ENV = "_FIBER_SHIP"
SHIPPED_ENV = "_FIBER_SHIPPED"
# (the wire's bytes, as fiber.wire.protocol has them; a test checks they agree)
FRAME = struct.Struct("<QI")
CHANNEL = struct.Struct("<Q")
OFFSET = struct.Struct("<Q")
MSG = b"M"
AUTH1, AUTH3 = b"A1", b"A3"
HUB_ROLE, CLIENT_ROLE = b"hub", b"client"
OK = b"\x00"
NONCE_SIZE = 32
# the ship channel's requests (fiber.runtime.ship.serving) and the control channel's
# message for a job that cannot run here (fiber.wire.protocol.Control.SHIPPING)
INFO, READ = b"I", b"R"
SHIPPING = b"S"
CONNECT_TIMEOUT = 10.0
REPLY_TIMEOUT = 120.0
ENTRY_INFO = ".fiber-ship.json"


class Refused(Exception):
    """This job cannot run on this host: the message says why and what to do."""


class Link:
    """One authenticated connection to the parent's stream listener."""

    def __init__(self, address: str, key: bytes) -> None:
        self.address = address
        rest, _, query = address[len("stream://"):].partition("?")
        host, _, port = rest.rpartition(":")
        local = query[len("local="):] if query.startswith("local=") else ""
        sock: socket.socket | None = None
        if local:  # (the parent's host and network namespace: its Unix socket)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect("\0" + local)
            except OSError:
                sock.close()
                sock = None
        if sock is None:
            sock = socket.create_connection((host.strip("[]"), int(port)),
                                            timeout=CONNECT_TIMEOUT)
        self.sock = sock
        nonce = os.urandom(NONCE_SIZE)
        reply = self._exchange(0, AUTH1 + nonce)
        proof = hmac.new(key, HUB_ROLE + nonce, hashlib.sha256).digest()
        if reply[:1] != OK or not hmac.compare_digest(reply[1 + NONCE_SIZE:], proof):
            raise OSError(f"the process at {address} does not hold this run's secret")
        answer = hmac.new(key, CLIENT_ROLE + reply[1:1 + NONCE_SIZE], hashlib.sha256).digest()
        if self._exchange(0, AUTH3 + answer)[:1] != OK:
            raise OSError(f"the process at {address} refused this run's secret")
        self.sock.settimeout(REPLY_TIMEOUT)

    def _read(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = self.sock.recv(min(n - len(data), 1 << 20))
            if not chunk:
                raise OSError(f"the connection to {self.address} closed")
            data += chunk
        return bytes(data)

    def _exchange(self, line: int, body: bytes) -> bytes:
        self.sock.sendall(FRAME.pack(len(body), line) + body)
        size, _ = FRAME.unpack(self._read(FRAME.size))
        return self._read(size)

    def request(self, channel: int, payload: bytes) -> bytes:
        """The payload of the reply; OSError for an error reply (its text)."""
        reply = self._exchange(1, MSG + CHANNEL.pack(channel) + payload)
        if reply[:1] != OK:
            raise OSError(reply[1:].decode("utf-8", "replace") or "the parent refused")
        return reply[1:]

    def close(self) -> None:
        self.sock.close()


def _secret() -> bytes:
    value = os.environ.get("_FIBER_AUTHKEY")
    path = os.environ.get("_FIBER_SECRETS_FILE")
    if not value and path:  # (fiber's bootstrap reads it again, and removes it)
        with open(path, encoding="utf-8") as f:
            for line in f.read().splitlines():
                name, _, text = line.partition("=")
                if name == "_FIBER_AUTHKEY":
                    value = text
    if not value:
        raise OSError("the job has no run secret (_FIBER_AUTHKEY)")
    return bytes.fromhex(value)


def interpreter() -> dict:
    """What decides whether this interpreter can run packages packed by another."""
    return {"implementation": sys.implementation.name,
            "version": list(sys.version_info[:2]),
            "abi": sysconfig.get_config_var("SOABI") or "",
            "platform": sys.platform,
            "executable": sys.executable,
            "full_version": sys.version.split()[0]}


def check_interpreter(parent: dict) -> None:
    ours = interpreter()
    keys = ("implementation", "version", "abi", "platform")
    if all(ours[k] == parent[k] for k in keys):
        return
    wanted = "{}.{}".format(*parent["version"])
    raise Refused(
        f"the job's Python cannot run this program: it is {ours['executable']} (Python "
        f"{ours['full_version']}, {ours['abi'] or ours['platform']}) on host "
        f"{socket.gethostname()}, and the program runs {parent['executable']} (Python "
        f"{parent['full_version']}, {parent['abi'] or parent['platform']}), whose "
        f"packages it ships. Install Python {wanted} on that host and name it in the "
        f"python setting (FIBER_PYTHON), or run the program with a Python like the host's.")


class Cache:
    """The host's per-user cache of unpacked archives."""

    def __init__(self, root: str, limit: int) -> None:
        root = os.path.expanduser(root) if root else os.path.join(
            tempfile.gettempdir(), f"fiber-ship-{os.getuid()}")
        self.root = root
        self.limit = limit
        self.held: list[int] = []  # lock descriptors held (shared) while this job runs
        parent = os.path.dirname(root.rstrip("/")) or "/"
        try:
            os.makedirs(parent, exist_ok=True)
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise Refused(f"cannot create the cache directory {root} on host "
                          f"{socket.gethostname()}: {exc.strerror or exc}; set ship_cache "
                          "to a directory of your own there") from None
        info = os.lstat(root)
        why = None
        if not stat.S_ISDIR(info.st_mode):
            why = "it is not a directory"
        elif info.st_uid != os.getuid():
            why = f"it belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
        elif info.st_mode & 0o077:
            why = f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in"
        if why is not None:
            raise Refused(
                f"the cache directory {root} on host {socket.gethostname()} is not a "
                f"directory private to this user: {why}. fiber does not use it: remove it "
                "if it is yours (or ask its owner to), or set ship_cache to another "
                "directory")

    # -- locks ----------------------------------------------------------------------
    def _lock(self, key: str, how: int) -> int:
        """A descriptor of ``<key>.lock`` locked ``how`` (the file that is there now:
        one removed by an eviction meanwhile is opened again)."""
        path = os.path.join(self.root, key + ".lock")
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            fcntl.flock(fd, how)
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)

    def ensure(self, link: Link, channel: int, archive: dict) -> str:
        """The directory of ``archive``'s files on this host, fetched and unpacked if
        missing; held (shared lock) until this process ends."""
        key = archive["key"]
        final = os.path.join(self.root, key)
        fd = self._lock(key, fcntl.LOCK_SH)
        added = False
        while not os.path.isdir(final):
            fcntl.flock(fd, fcntl.LOCK_EX)  # (drops the shared lock first: no deadlock)
            if not os.path.isdir(final):
                try:
                    self._fetch(link, channel, archive, final)
                except BaseException:
                    os.close(fd)
                    raise
                added = True
            fcntl.flock(fd, fcntl.LOCK_SH)
        os.utime(os.path.join(self.root, key + ".lock"))  # its last use, for eviction
        self.held.append(fd)
        if added:
            self.evict()
        return final

    def _space(self, needed: int) -> None:
        try:
            st = os.statvfs(self.root)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < needed:
            raise Refused(self._full(needed, free))

    def _full(self, needed: int, free: int | None = None) -> str:
        try:
            st = os.statvfs(self.root)
            free = st.f_bavail * st.f_frsize if free is None else free
        except OSError:
            pass
        have = f" ({free / 2**20:.1f} MiB free)" if free is not None else ""
        return (f"the disk of {self.root} on host {socket.gethostname()} is full{have}: "
                f"the program's files need {needed / 2**20:.1f} MiB there. Free space on "
                "it, or set ship_cache to a directory with room")

    def _fetch(self, link: Link, channel: int, archive: dict, final: str) -> None:
        key = archive["key"]
        described = json.loads(link.request(channel, INFO + key.encode()))
        size, digest = int(described["size"]), described["sha256"]
        self._space(size + int(archive["unpacked"]))
        stamp = f"{os.getpid()}-{os.urandom(4).hex()}"
        download = os.path.join(self.root, f".partial-{key[:16]}-{stamp}.tgz")
        unpacked = os.path.join(self.root, f".partial-{key[:16]}-{stamp}")
        try:
            hasher = hashlib.sha256()
            fd = os.open(download, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                offset = 0
                while offset < size:
                    chunk = link.request(channel, READ + key.encode() + OFFSET.pack(offset))
                    if not chunk:
                        raise OSError(f"the parent sent nothing at offset {offset} of {size}")
                    hasher.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view):]
                    offset += len(chunk)
            finally:
                os.close(fd)
            if offset != size or hasher.hexdigest() != digest:
                raise Refused(f"the archive {key[:12]} reached host {socket.gethostname()} "
                              "damaged (its SHA-256 differs from the parent's): run again")
            os.mkdir(unpacked, 0o700)
            with tarfile.open(download, "r:gz") as tar:
                members = tar.getmembers()
                for member in members:
                    name = member.name
                    if (name.startswith("/") or ".." in name.split("/")
                            or not (member.isfile() or member.isdir())):
                        raise Refused(f"the archive {key[:12]} holds {name!r}, which "
                                      "fiber does not unpack")
                if hasattr(tarfile, "data_filter"):  # (3.12, and backported)
                    tar.extractall(unpacked, members=members, filter="data")
                else:
                    tar.extractall(unpacked, members=members)
            with open(os.path.join(unpacked, ENTRY_INFO), "w", encoding="utf-8") as f:
                json.dump({"key": key, "size": int(archive["unpacked"]),
                           "kind": archive.get("kind", "")}, f)
            os.rename(unpacked, final)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise Refused(self._full(size + int(archive["unpacked"]))) from None
            raise
        finally:
            for path in (download, unpacked):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                elif os.path.exists(path):
                    os.unlink(path)

    def sweep(self) -> None:
        """Remove what jobs killed in a fetch or an eviction left (``.partial-*``,
        ``.evicted-*``, named with their pid): never used, and no longer being made."""
        for name in os.listdir(self.root):
            if not name.startswith((".partial-", ".evicted-")):
                continue
            try:
                pid = int(name.split("-")[2].split(".")[0])
                os.kill(pid, 0)
                continue  # (its process is alive: still at work)
            except ProcessLookupError:
                pass
            except (ValueError, IndexError, PermissionError):
                continue
            path = os.path.join(self.root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def evict(self) -> None:
        """Remove the least recently used entries no job holds while the cache is
        over its size (and the leftovers of killed jobs)."""
        self.sweep()
        entries = []
        total = 0
        for name in os.listdir(self.root):
            if len(name) != 64 or not os.path.isdir(os.path.join(self.root, name)):
                continue
            try:
                with open(os.path.join(self.root, name, ENTRY_INFO), encoding="utf-8") as f:
                    size = int(json.load(f)["size"])
                used = os.stat(os.path.join(self.root, name + ".lock")).st_mtime
            except (OSError, ValueError, KeyError):
                continue
            entries.append((used, name, size))
            total += size
        for _, name, size in sorted(entries):
            if total <= self.limit:
                return
            path = os.path.join(self.root, name + ".lock")
            try:
                fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # in use by a job
                continue
            try:
                gone = os.path.join(self.root, f".evicted-{name[:16]}-{os.getpid()}")
                os.rename(os.path.join(self.root, name), gone)
                os.unlink(path)
                shutil.rmtree(gone, ignore_errors=True)
                total -= size
            except OSError:
                pass
            finally:
                os.close(fd)


def enter(conf: dict, dirs: dict[str, str]) -> None:
    """Make this process look like the parent's job: the code first on ``sys.path``,
    then the standard library, the packages, the host's own site-packages; the working
    directory in the code; fiber's bootstrap told where the parent's paths are."""
    mapping = {}
    front = []
    for root in conf.get("roots", []):
        local = os.path.join(dirs["code"], root["name"])
        mapping[root["parent"]] = local
        if root.get("path"):
            front.append(local)
    site = [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    base = [p for p in sys.path if p and p not in site]
    packages = [dirs["packages"]] if "packages" in dirs else []
    sys.path[:] = front + base + packages + site
    cwd = conf.get("cwd")  # [the parent's root it is in, the path below it]
    here = (os.path.join(mapping[cwd[0]], cwd[1]) if cwd and cwd[0] in mapping
            else front[0] if front else None)
    if here and os.path.isdir(here):
        os.chdir(here)
    os.environ[SHIPPED_ENV] = json.dumps({"map": mapping, "cwd": here or os.getcwd()})
    # what the tasks' own Python subprocesses import (fiber's jobs run with -I)
    os.environ["PYTHONPATH"] = os.pathsep.join(front + packages)


def _report(link: Link | None, message: str) -> None:
    sys.stderr.write(f"fiber: this job cannot run on host {socket.gethostname()}: "
                     f"{message}\n")
    sys.stderr.flush()
    if link is not None:
        try:
            link.request(int(os.environ["_FIBER_CHANNEL"]),
                         SHIPPING + message.encode("utf-8", "replace"))
        except (OSError, KeyError, ValueError):
            pass


def main() -> None:
    conf = json.loads(os.environ.pop(SHIP_ENV))
    link = None
    try:
        link = Link(os.environ["_FIBER_PARENT"], _secret())
        check_interpreter(conf["python"])
        cache = Cache(conf.get("cache") or "", int(conf["cache_size"]))
        dirs = {archive["kind"]: cache.ensure(link, int(conf["channel"]), archive)
                for archive in conf["archives"]}
    except Refused as exc:
        _report(link, str(exc))
        os._exit(1)
    except OSError as exc:
        _report(link, f"{type(exc).__name__}: {exc}")
        os._exit(1)
    finally:
        if link is not None:
            link.close()
    enter(conf, dirs)
    started = time.monotonic()
    runpy.run_module("fiber.runtime.bootstrap", run_name="__main__", alter_sys=True)
    # (the bootstrap ends the process itself)
    sys.stderr.write(f"fiber: the bootstrap returned after {time.monotonic() - started:.1f}s\n")
    os._exit(1)


if __name__ == "__main__":
    main()
