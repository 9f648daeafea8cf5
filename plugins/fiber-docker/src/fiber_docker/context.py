"""The build context of a program's image, and the tag that names it by content.

With a ``Dockerfile`` in the program's directory, the context is that directory (as
``docker build DIR`` sends it: its ``.dockerignore`` patterns left out, and version
control, caches and virtual environments too). Without one, fiber writes the
Dockerfile (:func:`generated_dockerfile`) and the context holds the launching
environment's files the program needs (:mod:`fiber_docker.environment`) under
``site-packages/`` and the program's directory under ``app/``.

The tag is a hash of every file's path, mode and content and of the Dockerfile, so
an unchanged program gets the same tag (nothing is built or pushed again) and any
edited file a new one. The tar stream is written with fixed owners and times, so the
engine's layer cache and the registry's blobs are reused for unchanged layers.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import stat
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fiber_docker.environment import is_skipped_dir

#: where a generated image keeps the launching environment's packages and the program
SITE_DIR = "/opt/fiber/site-packages"
APP_DIR = "/app"
#: the mtime of every file in the context (the zip epoch)
MTIME = 315532800
#: changes when the generated Dockerfile's layout changes (a new tag for everyone)
RECIPE = "1"


@dataclass
class Context:
    """A build context: ``files`` (path in the context to file here, sorted), the
    Dockerfile's ``dockerfile`` text (None: it is one of ``files``), and its ``digest``
    (hex)."""

    files: list[tuple[str, Path]]
    dockerfile: str | None
    digest: str = field(default="")

    def size(self) -> int:
        return sum(path.stat().st_size for _, path in self.files)

    def write_tar(self, out: IO[bytes]) -> None:
        """The context as the tar stream the engine's build reads."""
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            dirs: set[str] = set()
            if self.dockerfile is not None:
                data = self.dockerfile.encode()
                info = _info("Dockerfile", 0o644)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            for arc, path in self.files:
                parts = arc.split("/")
                for depth in range(1, len(parts)):
                    parent = "/".join(parts[:depth])
                    if parent not in dirs:
                        dirs.add(parent)
                        entry = _info(parent, 0o755)
                        entry.type = tarfile.DIRTYPE
                        tar.addfile(entry)
                info = _info(arc, _mode(path))
                with open(path, "rb") as handle:
                    info.size = os.fstat(handle.fileno()).st_size
                    tar.addfile(info, handle)


def _info(name: str, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime, info.uid, info.gid = mode, MTIME, 0, 0
    info.uname = info.gname = "root"
    return info


def _mode(path: Path) -> int:
    return 0o755 if path.stat().st_mode & stat.S_IXUSR else 0o644


def _ignore_patterns(directory: Path) -> list[str]:
    ignore = directory / ".dockerignore"
    if not ignore.is_file():
        return []
    patterns = []
    for line in ignore.read_text(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and not line.startswith("!"):
            patterns.append(line.strip("/"))
    return patterns


def _ignored(relative: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(relative, p) or relative.startswith(p + "/")
               for p in patterns)


def program_files(directory: Path, prefix: str = "") -> list[tuple[str, Path]]:
    """The files of the program's directory (``prefix`` + their relative path):
    ``.dockerignore`` patterns, version control, caches, virtual environments and
    compiled bytecode left out. A file that cannot be read is an OSError naming it."""
    patterns = _ignore_patterns(directory)
    out = []
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not is_skipped_dir(here / d)
                         and not _ignored((here / d).relative_to(directory).as_posix(),
                                          patterns))
        for name in sorted(files):
            path = here / name
            relative = path.relative_to(directory).as_posix()
            if name.endswith((".pyc", ".pyo")) or _ignored(relative, patterns):
                continue
            if path.is_symlink() and not path.exists():
                continue  # a dangling link: nothing to copy
            if not os.access(path, os.R_OK):
                raise OSError(f"{path} cannot be read (its mode is "
                              f"{stat.filemode(path.stat().st_mode)})")
            out.append((prefix + relative, path))
    return out


def default_base() -> str:
    """The official Python image of the launching interpreter's version."""
    return f"python:{sys.version_info[0]}.{sys.version_info[1]}-slim"


def generated_dockerfile(base: str) -> str:
    """The Dockerfile of a program without one: ``base``, checked to have python3 of
    this interpreter's version; the packages on ``PYTHONPATH``; the program as the
    working directory. The packages come first, so a program's edit makes one new
    small layer."""
    major, minor = sys.version_info[:2]
    check = (f"import sys; v = sys.version_info[:2]; sys.exit(0 if v == ({major}, {minor}) "
             f"else 'fiber: the base image {base} has Python %d.%d but the program was "
             f"launched with Python {major}.{minor}, whose packages the image holds: set "
             f"the image_base setting to an image with python3 {major}.{minor}' % v)")
    return "\n".join([
        f"# generated by fiber (recipe {RECIPE}) for Python {major}.{minor}",
        f"FROM {base}",
        f"RUN [\"python3\", \"-c\", {_json(check)}]",
        f"COPY site-packages/ {SITE_DIR}/",
        f"ENV PYTHONPATH={SITE_DIR}",
        f"COPY app/ {APP_DIR}/",
        f"WORKDIR {APP_DIR}",
        "",
    ])


def _json(text: str) -> str:
    import json

    return json.dumps(text)


def digest(context: Context) -> str:
    """The hash of ``context``: every file's path, mode and content, the Dockerfile."""
    total = hashlib.sha256(RECIPE.encode())
    if context.dockerfile is not None:
        total.update(b"D\0" + context.dockerfile.encode() + b"\0")
    for arc, path in context.files:
        one = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                one.update(chunk)
        total.update(f"F\0{arc}\0{_mode(path):o}\0".encode() + one.digest())
    return total.hexdigest()


def from_dockerfile(directory: Path) -> Context:
    """The context of a program with its own Dockerfile."""
    context = Context(files=program_files(directory), dockerfile=None)
    context.digest = digest(context)
    return context


def generated(directory: Path, site: list[tuple[str, Path]], base: str) -> Context:
    """The context of a program without a Dockerfile (see the module docstring)."""
    files = [("site-packages/" + arc, path) for arc, path in site]
    files += program_files(directory, "app/")
    if not any(arc.startswith("app/") for arc, _ in files):
        files.append(("app/.fiber-empty", Path(os.devnull)))
    context = Context(files=files, dockerfile=generated_dockerfile(base))
    context.digest = digest(context)
    return context
