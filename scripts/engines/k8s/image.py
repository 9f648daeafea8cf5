"""Make the tarball of the test image: this Python installation (``sys.base_prefix``,
without its site-packages and test suite), the virtual environment running the tests
(``sys.prefix``) unless it lies under a path mounted into the pods anyway, and the
shared libraries they link, all at their own paths; ``docker import`` turns it into an
image. The tarball is cached under ``$FIBER_CACHE_DIR/k8s/images/<fingerprint>.tar``.

Usage: python image.py [--skip PATH]...   (prints the tarball's path)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("FIBER_CACHE_DIR", "/var/cache/fiber")) / "k8s" / "images"


def _excluded(base: Path) -> list[Path]:
    lib = Path(sysconfig.get_path("stdlib", vars={"installed_base": str(base),
                                                 "base": str(base)}))
    out = [lib / "test", lib / "site-packages", lib / "idlelib", lib / "tkinter"]
    out += list(lib.glob("config-*"))
    return out


def collect(skip: list[Path]) -> list[Path]:
    """Every file and symlink to put in the image."""
    roots = [Path(sys.base_prefix)]
    if Path(sys.prefix) != Path(sys.base_prefix) and not any(
            Path(sys.prefix).is_relative_to(s) for s in skip):
        roots.append(Path(sys.prefix))
    excluded = _excluded(Path(sys.base_prefix)) + skip
    files: list[Path] = []
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = [d for d in dirnames if here / d not in excluded
                           and not (here / d).is_symlink()]
            files.extend(here / f for f in filenames)
            files.extend(here / d for d in os.listdir(here)
                         if (here / d).is_symlink() and (here / d).is_dir())
    return files


def shared_libraries(files: list[Path]) -> set[Path]:
    """The libraries (and their symlinks) that the ELF files among ``files`` need."""
    elves = [f for f in files if f.is_file() and not f.is_symlink()
             and (f.suffix == ".so" or ".so." in f.name or os.access(f, os.X_OK))
             and f.open("rb").read(4) == b"\x7fELF"]
    libs: set[Path] = set()
    for start in range(0, len(elves), 200):
        out = subprocess.run(["ldd", *map(str, elves[start:start + 200])],
                             capture_output=True, text=True).stdout
        for match in re.finditer(r"(/\S+) \(0x", out):
            libs.add(Path(match.group(1)))
    result: set[Path] = set()
    for lib in libs:
        # under its real directory (/lib -> usr/lib on merged-/usr systems), plus the
        # file it links to when it is a symlink itself
        canonical = lib.parent.resolve() / lib.name
        result.update({canonical, canonical.resolve()})
    return result


def _top_symlinks() -> list[Path]:
    """/lib, /lib64, /bin, /sbin when they are symlinks (merged /usr)."""
    return [p for p in map(Path, ("/lib", "/lib64", "/lib32", "/bin", "/sbin")) if p.is_symlink()]


def build(skip: list[Path]) -> Path:
    files = collect(skip)
    # the venv may be mounted rather than copied, but its extension modules still need
    # their shared libraries in the image
    extensions = [Path(d) / f for d, _, names in os.walk(sys.prefix) for f in names
                  if ".so" in f] if Path(sys.prefix) != Path(sys.base_prefix) else []
    scanned = sorted(set(files) | set(extensions))
    digest = hashlib.sha256()
    for f in scanned:
        try:
            st = f.lstat()
        except FileNotFoundError:
            continue
        digest.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    out = CACHE / f"{digest.hexdigest()[:16]}.tar"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    libs = shared_libraries(scanned)
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        added: set[str] = set()
        for name, mode in (("tmp", 0o1777), ("etc", 0o755), ("root", 0o700)):
            added.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
                           ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
            added.add(name)
        for path in sorted(set(files) | libs | set(_top_symlinks())):
            # parents first, as directories or the symlinks they are (/lib -> usr/lib)
            for parent in reversed(path.parents[:-1]):
                key = str(parent).lstrip("/")
                if key not in added:
                    added.add(key)
                    tar.add(str(parent), arcname=key, recursive=False)
            key = str(path).lstrip("/")
            if key not in added and (path.exists() or path.is_symlink()):
                added.add(key)
                tar.add(str(path), arcname=key, recursive=False)
    tmp.rename(out)
    # keep the three newest tarballs (several venvs may take turns)
    for old in sorted(CACHE.glob("*.tar"), key=lambda p: p.stat().st_mtime)[:-3]:
        old.unlink(missing_ok=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip", action="append", default=[], type=Path,
                        help="path not to copy (it is mounted into the pods)")
    args = parser.parse_args()
    print(build([p.resolve() for p in args.skip]))


if __name__ == "__main__":
    main()
