"""What of the launching Python environment a generated image holds.

The distributions a program needs: those named by the caller (fiber-core and the
backend's plugin), those the program's own files import (found by reading their
``import`` statements, mapped to distributions with
:func:`importlib.metadata.packages_distributions`), and everything those require, as
installed here (the closure of their ``Requires-Dist``, without extras). Each
distribution contributes its installed files (as venv-pack does, not wheels): the ones
its ``RECORD`` lists under its site-packages directory, without compiled bytecode. An
editable install (``direct_url.json`` says so) contributes its metadata and the
packages its ``top_level.txt`` names, copied from where they are imported from, so the
image holds the code and not a path to this machine's source tree.

:func:`site_files` returns ``(path in site-packages, file here)`` pairs; the image puts
them in one directory on ``PYTHONPATH``.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger("fiber.docker")

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
# files of an installed distribution that belong to this installation only
_INSTALL_ONLY = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
#: directories never shipped from a program's directory
SKIPPED_DIRS = {".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".mypy_cache",
                ".pytest_cache", ".ruff_cache", "node_modules"}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_skipped_dir(path: Path) -> bool:
    """A directory of the program's tree that is not the program's code: version
    control, caches, and virtual environments (a ``pyvenv.cfg``)."""
    return path.name in SKIPPED_DIRS or (path / "pyvenv.cfg").exists()


def program_imports(directory: Path) -> set[str]:
    """Top-level module names imported by the ``.py`` files under ``directory`` that
    are not the program's own modules (files and packages in its tree) nor the
    standard library's."""
    names: set[str] = set()
    own: set[str] = set()
    for root, dirs, files in os.walk(directory):
        here = Path(root)
        dirs[:] = [d for d in dirs if not is_skipped_dir(here / d)]
        own.update(d for d in dirs)
        for name in files:
            if not name.endswith(".py"):
                continue
            own.add(name[:-3])
            try:
                tree = ast.parse((here / name).read_bytes(), filename=str(here / name))
            except (SyntaxError, ValueError, OSError) as exc:
                logger.debug("not reading the imports of %s: %s", here / name, exc)
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names - own - set(sys.stdlib_module_names)


def _requirement(text: str) -> str | None:
    """The distribution a ``Requires-Dist`` line needs here, or None (an extra's, or
    one whose marker is false on this machine)."""
    spec, _, marker = text.partition(";")
    if "extra" in marker:
        return None
    if marker.strip():
        try:
            from packaging.markers import Marker
        except ImportError:  # no way to judge it: take it when it is installed
            pass
        else:
            try:
                if not Marker(marker.strip()).evaluate():
                    return None
            except Exception:  # noqa: BLE001 - a marker we cannot read: take it
                pass
    match = _NAME.match(spec)
    return canonical(match.group(1)) if match else None


def installed() -> dict[str, md.Distribution]:
    """The distributions this interpreter sees, by canonical name (the first one on
    ``sys.path`` wins, as for imports)."""
    found: dict[str, md.Distribution] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist)
    return found


def needed(packages: Iterable[str], imports: Iterable[str]) -> list[md.Distribution]:
    """The distributions ``packages`` (names) and the modules ``imports`` need, with
    what they require, sorted by name. A named package that is not installed is an
    error (ValueError naming it); an import no distribution provides is left out (the
    program may not need it, as an optional import)."""
    dists = installed()
    by_module = md.packages_distributions()
    todo = []
    for name in packages:
        if canonical(name) not in dists:
            raise ValueError(f"{name} is not installed in this environment "
                             f"({sys.prefix})")
        todo.append(canonical(name))
    for module in sorted(imports):
        for provider in by_module.get(module, []):
            todo.append(canonical(provider))
    chosen: dict[str, md.Distribution] = {}
    while todo:
        name = todo.pop()
        if name in chosen or name not in dists:
            continue
        chosen[name] = dists[name]
        for line in dists[name].requires or []:
            wanted = _requirement(line)
            if wanted is not None:
                todo.append(wanted)
    return [chosen[name] for name in sorted(chosen)]


def _editable(dist: md.Distribution) -> bool:
    text = dist.read_text("direct_url.json")
    if not text:
        return False
    try:
        return bool(json.loads(text).get("dir_info", {}).get("editable"))
    except ValueError:
        return False


def _dist_info(dist: md.Distribution) -> Path | None:
    path = getattr(dist, "_path", None)  # importlib.metadata.PathDistribution
    return Path(path) if path is not None else None


def _tree(top: Path, arc: str) -> Iterator[tuple[str, Path]]:
    """The files of a package directory ``top`` (bytecode left out) as ``arc/...``."""
    for root, dirs, files in os.walk(top):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                yield f"{arc}/{(here / name).relative_to(top).as_posix()}", here / name


def _editable_files(dist: md.Distribution, info: Path) -> Iterator[tuple[str, Path]]:
    for item in sorted(info.iterdir()):
        if item.is_file() and item.name not in _INSTALL_ONLY:
            yield f"{info.name}/{item.name}", item
    tops = (dist.read_text("top_level.txt") or "").split()
    if not tops:
        raise ValueError(f"{dist.metadata['Name']} is an editable install without "
                         "top_level.txt: install it normally (pip install without -e) "
                         "to put it in an image")
    for top in tops:
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise ValueError(f"{top}, a module of the editable install "
                             f"{dist.metadata['Name']}, cannot be found")
        if spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                yield from _tree(Path(location), top)
        elif spec.origin:
            origin = Path(spec.origin)
            yield origin.name, origin


def site_files(dists: Iterable[md.Distribution]) -> list[tuple[str, Path]]:
    """``(path under site-packages, file here)`` for every file of ``dists``, sorted."""
    out: dict[str, Path] = {}
    for dist in dists:
        info = _dist_info(dist)
        if info is None:
            raise ValueError(f"{dist.metadata['Name']} is not installed as files "
                             "(a zip or egg): it cannot be copied into an image")
        if _editable(dist):
            out.update(_editable_files(dist, info))
            continue
        site = info.parent
        for entry in dist.files or []:
            path = Path(os.path.normpath(site / entry))
            if (not path.is_relative_to(site) or "__pycache__" in entry.parts
                    or entry.name in _INSTALL_ONLY and entry.parent.name == info.name
                    or path.suffix in (".pyc", ".pyo") or not path.is_file()):
                continue
            out[path.relative_to(site).as_posix()] = path
    return sorted(out.items())
