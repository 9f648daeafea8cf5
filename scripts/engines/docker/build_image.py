"""Build a minimal container image holding one Python installation and one virtual
environment at the paths they have on this machine, and import it into a Docker
engine (no registry, no Dockerfile, no base image).

The image holds: the Python installation (``sys.base_prefix``, without its own
site-packages, test suite and static library), the virtual environment
(``sys.prefix``), every shared library the interpreter and the extension modules
link (found with ``ldd``) with the dynamic loader and ``/etc/ld.so.cache``, ``/bin/sh``,
the user and group files, ``/tmp`` and ``/root``. Editable installs are *not* copied:
their source directories must be mounted into the containers at the same path (the
test engine mounts them read-only); :func:`editable_roots` lists them.

The image is tagged ``<repository>:<key>`` where the key hashes the interpreter, the
environment's paths and its package list (names, versions, entry points, install
origin), so a cached image is reused exactly while the environment is unchanged.

Usage: ``python build_image.py --docker-host unix:///path/docker.sock [--python PY]``
prints the tag.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("fiber.docker.testimage")

RECIPE_VERSION = "1"
#: the same for the bare images (build(bare=True))
BARE_RECIPE = "2"
REPOSITORY = "fiber-test-python"
IMAGE_LABEL = "fiber.test-image"
EXTRA_FILES = ["/etc/ld.so.cache", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf",
               "/bin/sh", "/usr/bin/env"]
EXTRA_DIRS = {"/tmp": 0o1777, "/root": 0o700, "/etc": 0o755, "/proc": 0o555, "/sys": 0o555,
              "/dev": 0o755}

_PROBE = r"""
import json, sys, sysconfig, importlib.metadata as md
dists = []
for d in md.distributions():
    dists.append([d.metadata["Name"], d.version, d.read_text("entry_points.txt") or "",
                  d.read_text("direct_url.json") or ""])
print(json.dumps({
    "executable": sys.executable, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
    "version": sys.version, "stdlib": sysconfig.get_paths()["stdlib"],
    "base_purelib": sysconfig.get_paths(vars={"base": sys.base_prefix,
                                               "platbase": sys.base_prefix})["purelib"],
    "purelib": sysconfig.get_paths()["purelib"], "dists": sorted(dists),
}))
"""


def probe(python: str) -> dict:
    """What the image must hold for ``python`` (an interpreter of a venv)."""
    out = subprocess.run([python, "-c", _PROBE], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def image_key(info: dict) -> str:
    """A hash naming exactly this interpreter + environment."""
    pth = []
    purelib = Path(info["purelib"])
    for path in sorted(purelib.glob("*.pth")):
        pth.append([path.name, path.read_text(errors="replace")])
    material = json.dumps([RECIPE_VERSION, info["executable"], info["prefix"],
                           info["base_prefix"], info["version"], info["dists"], pth])
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def editable_roots(info: dict) -> list[str]:
    """Source directories of the environment's editable installs (outermost only)."""
    roots = []
    for _name, _version, _eps, direct_url in info["dists"]:
        if not direct_url:
            continue
        data = json.loads(direct_url)
        if data.get("dir_info", {}).get("editable") and data.get("url", "").startswith("file://"):
            roots.append(os.path.realpath(data["url"][len("file://"):]))
    roots.sort()
    outer: list[str] = []
    for root in roots:
        if not any(root == o or root.startswith(o.rstrip("/") + "/") for o in outer):
            outer.append(root)
    return outer


class _Tar:
    """A tarball of host paths at the same paths, symlinks and parent dirs included."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.done: set[str] = set()

    def _entry(self, path: str) -> None:
        if path in self.done:
            return
        self.done.add(path)
        info = self.tar.gettarinfo(path, arcname=path.lstrip("/"))
        if info.isreg():
            with open(path, "rb") as handle:
                self.tar.addfile(info, handle)
        else:
            self.tar.addfile(info)

    def ensure(self, path: str, depth: int = 0) -> None:
        """Add ``path`` so that it resolves in the image exactly as here."""
        if depth > 20 or not os.path.lexists(path):
            return
        current = "/"
        for part in os.path.abspath(path).strip("/").split("/"):
            nxt = os.path.join(current, part)
            if os.path.islink(nxt):
                self._entry(nxt)
                self.ensure(os.path.normpath(os.path.join(current, os.readlink(nxt))), depth + 1)
                current = os.path.realpath(nxt)
            else:
                self._entry(nxt)
                current = nxt

    def tree(self, root: str, skip: set[str]) -> list[str]:
        """Add everything under ``root`` except ``skip``; return its ELF candidates."""
        shared = []
        self.ensure(root)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                self.ensure(path)
                if not os.path.islink(path) and (name.endswith(".so") or ".so." in name):
                    shared.append(path)
        return shared


def linked_libraries(binaries: list[str]) -> set[str]:
    """Every shared library (and the loader) ``binaries`` link, as ldd resolves them."""
    found: set[str] = set()
    for start in range(0, len(binaries), 200):
        batch = binaries[start:start + 200]
        out = subprocess.run(["ldd", *batch], capture_output=True, text=True).stdout
        for line in out.splitlines():
            line = line.strip()
            if "=>" in line:
                target = line.split("=>", 1)[1].strip().split(" (")[0].strip()
                if target.startswith("/"):
                    found.add(target)
                elif "not found" in target:
                    logger.warning("ldd: %s", line)
            elif line.startswith("/") and " (" in line:
                found.add(line.split(" (")[0])
    return found


def write_tarball(info: dict, out: str, bare: bool = False) -> None:
    """The image's root filesystem for ``info`` (see :func:`probe`); ``bare``: the
    Python installation alone, without any site-packages (no venv, nothing installed)."""
    base, prefix = info["base_prefix"], info["prefix"]
    if bare:
        prefix = base
    stdlib = info["stdlib"]
    skip = {os.path.join(stdlib, "test"), os.path.join(base, "include"),
            os.path.join(base, "share"), os.path.join(base, "lib", "pkgconfig")}
    skip.update(str(p) for p in Path(stdlib).glob("config-*"))
    if prefix != base or bare:  # a venv: the base installation's own packages are not used
        skip.add(info["base_purelib"])
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as raw:
        tar = _Tar(raw)
        for directory, mode in EXTRA_DIRS.items():
            entry = tarfile.TarInfo(directory.lstrip("/"))
            entry.type, entry.mode, entry.mtime = tarfile.DIRTYPE, mode, int(time.time())
            raw.addfile(entry)
            tar.done.add(directory)
        elves = tar.tree(base, skip)
        if prefix != base:
            elves += tar.tree(prefix, set())
        executable = info["executable"] if not bare else os.path.realpath(info["executable"])
        for path in (executable, os.path.realpath(executable)):
            tar.ensure(path)
        elves += [os.path.realpath(executable), os.path.realpath("/bin/sh")]
        for path in EXTRA_FILES:
            tar.ensure(path)
        if bare and info["prefix"] != base:
            # the system libraries the venv's extension modules link (a Python image
            # has the whole C library): not the venv's own files
            venv = info["prefix"].rstrip("/") + "/"
            elves += [os.path.join(root, name) for root, _, names in os.walk(venv)
                      for name in names if name.endswith(".so") or ".so." in name]
        for library in sorted(linked_libraries(elves)):
            if bare and library.startswith(info["prefix"].rstrip("/") + "/"):
                continue
            tar.ensure(library)
            tar.ensure(os.path.realpath(library))


def build(client, python: str = sys.executable, repository: str = REPOSITORY,
          workdir: str | None = None, bare: bool = False) -> str:
    """Import the image for ``python`` into the engine of ``client`` (a
    ``docker.DockerClient``) unless it is there already; return its tag. Older tags of
    ``repository`` are removed. ``bare``: only the Python installation (nothing of the
    venv, no site-packages), with its ``bin`` directory first on ``PATH`` (``python3``
    is that Python): a base image for ``fiber build``'s tests, in which fiber cannot
    be imported."""
    import docker.errors

    info = probe(python)
    tag = f"{repository}:{image_key(info)}{'-bare' + BARE_RECIPE if bare else ''}"
    try:
        client.images.get(tag)
        logger.info("test image %s is cached", tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fiber-image-", dir=workdir) as tmp:
        tarball = os.path.join(tmp, "rootfs.tar")
        write_tarball(info, tarball, bare)
        size = os.path.getsize(tarball)
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if bare:
            path = os.path.join(info["base_prefix"], "bin") + ":" + path
        client.api.import_image_from_file(
            tarball, repository=repository, tag=tag.split(":", 1)[1],
            changes=[f"ENV PATH={path}", f"LABEL {IMAGE_LABEL}=1"],
        )
    logger.info("built test image %s (%.0f MB) in %.1fs", tag, size / 1e6,
                time.monotonic() - started)
    for image in client.images.list(name=repository):
        if tag not in image.tags and any(("-bare" in t) == bare for t in image.tags):
            for old in image.tags:
                client.images.remove(old, force=True)
    return tag


def main() -> None:
    import docker

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docker-host", required=True)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    client = docker.DockerClient(base_url=args.docker_host, version="auto")
    sys.stdout.write(build(client, args.python) + "\n")


if __name__ == "__main__":
    main()
