"""Content-addressed archives of files, as they travel to jobs.

An archive's *key* is the SHA-256 of its manifest: every file's path in the archive,
whether it is executable, and the SHA-256 of its bytes, in path order. The same files
give the same key on every run and every machine; a changed byte gives a new key, so
a job sees one version of the files or another, never a mix. The archive itself is a
gzip'd tar made the same way every time (entries in path order, fixed times, owners
and modes), kept in this user's store of sent archives
(``<tmp>/fiber-ship-<uid>/sent/<key>.tgz``, private to the user, bounded by
``ship_cache_size``: the oldest go first) so that a program run again does not pack it
again; its own SHA-256 is what a job checks after the transfer.

An archive larger than ``ship_limit`` (the files' bytes, before compression) is
refused with the largest files named; a file that cannot be read is refused with its
path and the reason, before any job starts.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import stat
import tarfile
import tempfile
import threading
from dataclasses import dataclass

from fiber.errors import ShipError
from fiber.host import check_private

__all__ = ["Archive", "build", "store_directory"]

logger = logging.getLogger("fiber")

#: the version of the manifest's format (part of every key)
FORMAT = b"fiber-ship 1\n"
_MTIME = 1_000_000_000  # every entry's time (the files' own would change the bytes)
_LARGEST = 5  # files named when an archive is over the limit
_lock = threading.Lock()


@dataclass(frozen=True)
class Archive:
    """One archive ready to be sent: its ``key`` (the manifest's hash), the ``path`` of
    its bytes, their ``size`` and ``sha256``, and the bytes of its files once
    unpacked (``unpacked``)."""

    kind: str
    key: str
    path: str
    size: int
    sha256: str
    unpacked: int
    files: int


def store_directory() -> str:
    """This user's store of sent archives (private; made if missing)."""
    root = os.path.join(tempfile.gettempdir(), f"fiber-ship-{os.getuid()}")
    for path in (root, os.path.join(root, "sent")):
        if check_private(path) is None:
            raise ShipError(f"cannot create the directory {path} for the archives sent "
                            "to jobs: set TMPDIR to a directory of your own")
    return os.path.join(root, "sent")


def _mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"


def _sizes(kind: str, entries: list[tuple[str, str]]) -> list[tuple[str, str, int, bool]]:
    out = []
    for name, source in entries:
        try:
            info = os.stat(source)
        except OSError as exc:
            raise ShipError(
                f"cannot read {source} (shipped with the program's {kind} as {name}): "
                f"{exc.strerror or exc}. Make it readable, or leave it out (a .gitignore "
                "pattern, or the ship setting)") from None
        if not stat.S_ISREG(info.st_mode):
            continue  # (a socket, a pipe: nothing to send)
        out.append((name, source, info.st_size, bool(info.st_mode & 0o111)))
    return out


def _check_limit(kind: str, files: list[tuple[str, str, int, bool]], limit: int) -> None:
    total = sum(size for _, _, size, _ in files)
    if total <= limit:
        return
    largest = sorted(files, key=lambda f: -f[2])[:_LARGEST]
    named = ", ".join(f"{source} ({_mib(size)})" for _, source, size, _ in largest)
    raise ShipError(
        f"the program's {kind} to ship to jobs are {_mib(total)} in {len(files)} files, "
        f"over the ship_limit of {_mib(limit)}; the largest: {named}. Leave such files "
        "out (a .gitignore pattern; data belongs on a shared disk or in the tasks' "
        "arguments), or raise ship_limit")


def _read(source: str, name: str, kind: str) -> bytes:
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ShipError(
            f"cannot read {source} (shipped with the program's {kind} as {name}): "
            f"{exc.strerror or exc}. Make it readable, or leave it out (a .gitignore "
            "pattern, or the ship setting)") from None


def build(kind: str, entries: list[tuple[str, str]], limit: int) -> Archive:
    """The archive of ``entries`` (``(path in the archive, source path)``), at most
    ``limit`` bytes of files; made now unless the store has it."""
    files = sorted(_sizes(kind, entries))
    _check_limit(kind, files, limit)
    manifest = hashlib.sha256(FORMAT)
    for name, source, _, executable in files:
        digest = hashlib.sha256(_read(source, name, kind)).hexdigest()
        manifest.update(f"{name}\0{int(executable)}\0{digest}\n".encode())
    key = manifest.hexdigest()
    store = store_directory()
    path = os.path.join(store, key + ".tgz")
    with _lock:
        known = _known(path)
        if known is None:
            known = _write(kind, files, path)
            _evict(store, keep=path)
    size, digest = known
    unpacked = sum(size for _, _, size, _ in files)
    return Archive(kind, key, path, size, digest, unpacked, len(files))


def _known(path: str) -> tuple[int, str] | None:
    """The size and SHA-256 of the stored archive ``path`` (None: not stored)."""
    try:
        with open(path + ".json", encoding="utf-8") as f:
            info = json.load(f)
        if os.stat(path).st_size != int(info["size"]):
            return None
        os.utime(path)  # its last use: the store keeps the recent ones
        return int(info["size"]), str(info["sha256"])
    except (OSError, ValueError, KeyError):
        return None


def _write(kind: str, files: list[tuple[str, str, int, bool]],
           path: str) -> tuple[int, str]:
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6,
                               mtime=0) as zipped:
                with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for name, source, _, executable in files:
                        data = _read(source, name, kind)
                        info = tarfile.TarInfo(name)
                        info.size = len(data)
                        info.mtime = _MTIME
                        info.mode = 0o755 if executable else 0o644
                        info.uid = info.gid = 0
                        info.uname = info.gname = ""
                        tar.addfile(info, _Bytes(data))
        digest = hashlib.sha256()
        with open(partial, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        size = os.stat(partial).st_size
        with open(partial + ".json", "w", encoding="utf-8") as f:
            json.dump({"size": size, "sha256": digest.hexdigest()}, f)
        os.replace(partial, path)
        os.replace(partial + ".json", path + ".json")
    except OSError as exc:
        raise ShipError(f"cannot write the archive of the program's {kind} to {path}: "
                        f"{exc.strerror or exc}") from None
    finally:
        for leftover in (partial, partial + ".json"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    logger.debug("packed the program's %s into %s (%s)", kind, path, _mib(size))
    return size, digest.hexdigest()


class _Bytes:
    """A file-like object over bytes (what ``TarFile.addfile`` reads)."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._at + n
        chunk = self._data[self._at:end].tobytes()
        self._at += len(chunk)
        return chunk


#: the store keeps at most this many bytes of archives (beyond, the oldest go)
STORE_LIMIT = 4 << 30


def _evict(store: str, keep: str) -> None:
    entries = []
    for name in os.listdir(store):
        if not name.endswith(".tgz"):
            continue
        path = os.path.join(store, name)
        try:
            info = os.stat(path)
        except OSError:
            continue
        entries.append((info.st_mtime, path, info.st_size))
    total = sum(size for _, _, size in entries)
    for _, path, size in sorted(entries):
        if total <= STORE_LIMIT:
            return
        if path == keep:
            continue
        for leftover in (path, path + ".json"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        total -= size
