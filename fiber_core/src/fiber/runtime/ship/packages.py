"""The installed distributions that travel to jobs, packed from this machine's own
files (as venv-pack does): fiber-core, the backend's plugin, what the ``ship`` setting
names (``pkg:NAME``, ``req:FILE``), and everything they require, found through
:mod:`importlib.metadata`.

A distribution's files are those its ``RECORD`` lists under its site directory
(scripts installed elsewhere, ``.pyc`` files and ``.pth`` files are left out: the
job imports from the shipped directory directly, without ``site``). An editable
install (``direct_url.json`` says so) has only a pointer there: its top-level
packages (``top_level.txt``) are taken from where this Python imports them, with its
``.dist-info`` directory, so that its entry points (fiber's plugins) are found in the
job too.

Requirements are followed by name: one with an ``extra`` marker is not followed (the
extras wanted are not known); one with another marker (a Python version, a platform)
is followed when it is installed here, and passed over when not (its marker is then
false here, or the environment is broken, which the job's import would tell).
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import logging
import os
import re
import sys

from fiber.errors import ShipError
from fiber.runtime.ship.code import Root, walk

__all__ = ["closure", "files_of", "requirement_names"]

logger = logging.getLogger("fiber")

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requires(dist: metadata.Distribution) -> list[tuple[str, bool]]:
    """``(name, conditional)`` of what ``dist`` requires, but for extras."""
    out = []
    for text in dist.requires or ():
        requirement, _, marker = text.partition(";")
        if "extra" in marker:
            continue
        match = _NAME.match(requirement)
        if match:
            out.append((match.group(1), bool(marker.strip())))
    return out


def _find(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def closure(names: list[tuple[str, str]]) -> list[metadata.Distribution]:
    """The distributions ``names`` (each with what asked for it, for the error) and
    everything they require, once each. Raises :class:`ShipError` for a name not
    installed for this Python."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(name, why, False) for name, why in names]
    while todo:
        name, why, conditional = todo.pop(0)
        key = _normal(name)
        if key in found:
            continue
        dist = _find(name)
        if dist is None:
            if conditional:
                logger.debug("not shipping %s (required by %s under a marker): not installed",
                             name, why)
                continue
            raise ShipError(
                f"{why} names the package {name}, which is not installed for this Python "
                f"({sys.executable}), so it cannot be shipped to the jobs: install it "
                f"(`{sys.executable} -m pip install {name}`) or take it out of the ship "
                "setting")
        found[key] = dist
        for required, under_marker in _requires(dist):
            todo.append((required, f"{dist.metadata['Name']} (a requirement of it)",
                         under_marker))
    return sorted(found.values(), key=lambda d: _normal(d.metadata["Name"]))


def _editable(dist: metadata.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except ValueError:
        return False


def files_of(dist: metadata.Distribution) -> list[tuple[str, str]]:
    """``(path in the site directory, source path)`` of the files of ``dist`` that
    travel."""
    name = dist.metadata["Name"]
    out: list[tuple[str, str]] = []
    listed = dist.files
    if listed is None:
        raise ShipError(f"the installed package {name} has no list of its files (RECORD), "
                        "so fiber cannot ship it: reinstall it with pip")
    editable = _editable(dist)
    for item in listed:
        rel = str(item).replace(os.sep, "/")
        if rel.startswith("../") or rel.startswith("/") or "/__pycache__/" in f"/{rel}":
            continue
        if rel.endswith((".pyc", ".pyo", ".pth")):
            continue
        if editable and ".dist-info/" not in rel:
            continue  # (the editable pointer: the real files come below)
        out.append((rel, str(dist.locate_file(item))))
    if editable:
        tops = (dist.read_text("top_level.txt") or "").split()
        if not tops:
            raise ShipError(f"{name} is installed in editable mode and does not say which "
                            "packages it holds (no top_level.txt): name its directories "
                            "in the ship setting instead")
        for top in tops:
            spec = importlib.util.find_spec(top)
            if spec is None:
                raise ShipError(f"{name} is installed in editable mode, but its package "
                                f"{top} cannot be found by this Python")
            if spec.submodule_search_locations:
                package = os.path.abspath(list(spec.submodule_search_locations)[0])
                root = Root(os.path.dirname(package), {os.path.basename(package)})
            else:
                origin = os.path.abspath(str(spec.origin))
                root = Root(os.path.dirname(origin), {os.path.basename(origin)})
            out.extend(walk(root))
    return sorted(set(out))


def requirement_names(path: str, cwd: str) -> list[str]:
    """The names a requirements file lists (``-r`` files it includes too); options
    and URLs are passed over."""
    full = os.path.join(cwd, os.path.expanduser(path))
    try:
        with open(full, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ShipError(f"the ship setting names the requirements file {path}, which "
                        f"cannot be read ({exc.strerror or exc})") from None
    names = []
    for line in lines:
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            names.extend(requirement_names(line.split(None, 1)[1],
                                           os.path.dirname(full)))
            continue
        if line.startswith("-") or "://" in line:
            continue
        match = _NAME.match(line)
        if match:
            names.append(match.group(1))
    return names
