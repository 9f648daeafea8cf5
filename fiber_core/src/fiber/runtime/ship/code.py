"""The program's own files that travel to jobs: which directories (*roots*) and which
files in them.

A root is a directory of this machine that is a place code is imported from: the
main script's directory (or, for ``python -m pkg.mod``, the ``sys.path`` entry that
holds ``pkg``), a directory the ``ship`` setting names, or the directory of a module
it names (then only that module's files). In the job, each root is a directory of
the host's cache, put on ``sys.path`` in the same order, and every path of the
parent's under a root (``sys.path`` entries, the main script, the working directory)
is mapped to its place there (:mod:`fiber.runtime.ship.localize`).

Left out of a directory: version control (``.git``, ``.hg``, ``.svn``), caches
(``__pycache__``, ``.pytest_cache``, ``.mypy_cache``, ``.ruff_cache``, ``.tox``,
``.nox``), virtual environments (a directory holding ``pyvenv.cfg``), symbolic links
to directories, and whatever the ``.gitignore`` files of the root and below it
ignore (the usual patterns: ``*``, ``?``, ``[...]``, ``**``, a leading or inner ``/``
anchoring a pattern to its file's directory, a trailing ``/`` for directories only,
``!`` to take a pattern back).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass, field

from fiber.errors import ShipError

__all__ = ["Root", "main_root", "named_root", "walk", "Ignore"]

#: directories never shipped
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".pytest_cache",
                          ".mypy_cache", ".ruff_cache", ".tox", ".nox", ".ipynb_checkpoints"})


@dataclass
class Root:
    """A directory of this machine whose files (all, or only ``only``: names of files
    or directories directly in it) travel; ``path``: whether jobs import from it."""

    path: str
    only: set[str] | None = None
    on_path: bool = True
    name: str = ""  # its directory's name in the archive (set when the plan is made)
    files: list[tuple[str, str]] = field(default_factory=list)  # (in archive, source)


def main_root() -> Root | None:
    """The root of the program's main module: the script's directory, or the
    ``sys.path`` entry a module run with ``-m`` was found in; None in an interactive
    session (what it defines travels by value)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    path = os.path.abspath(path)
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        depth = spec.name.count(".") + (1 if os.path.basename(path) == "__init__.py" else 0)
        top = os.path.dirname(path)
        for _ in range(depth):
            top = os.path.dirname(top)
        return Root(top)
    return Root(os.path.dirname(path))


def named_root(item: str, cwd: str) -> Root:
    """The root of one item of the ``ship`` setting: a directory (all of it), a file
    (that file, in its directory), else a top-level module's name (its package
    directory or file). Raises :class:`ShipError` for what is none of these."""
    path = os.path.join(cwd, os.path.expanduser(item))
    if os.path.isdir(path):
        return Root(os.path.abspath(path))
    if os.path.isfile(path):
        path = os.path.abspath(path)
        return Root(os.path.dirname(path), {os.path.basename(path)})
    if os.path.lexists(path):
        raise ShipError(f"the ship setting names {item}, which is neither a file nor a "
                        "directory: name a directory, a file or a module")
    spec = None
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item):
        try:
            spec = importlib.util.find_spec(item)
        except (ImportError, ValueError):
            spec = None
    if spec is None or (spec.origin in (None, "built-in", "frozen")
                        and not spec.submodule_search_locations):
        raise ShipError(
            f"the ship setting names {item!r}, which does not exist: it is no file or "
            f"directory (from {cwd}) and no module this Python can import. Name an "
            "existing directory, file or module (an installed distribution as pkg:NAME)")
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        package = os.path.abspath(locations[0])
        return Root(os.path.dirname(package), {os.path.basename(package)})
    origin = os.path.abspath(str(spec.origin))
    return Root(os.path.dirname(origin), {os.path.basename(origin)})


class Ignore:
    """The patterns of ``.gitignore`` files, each relative to its file's directory."""

    def __init__(self) -> None:
        # (directory, regex, negated, directories only), in the order read
        self.rules: list[tuple[str, re.Pattern[str], bool, bool]] = []

    def read(self, directory: str, rel: str) -> None:
        """Add the patterns of ``directory``'s ``.gitignore`` (``rel``: the directory
        relative to the root, "" for the root)."""
        try:
            with open(os.path.join(directory, ".gitignore"), encoding="utf-8",
                      errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            if negated:
                line = line[1:]
            line = line.replace("\\ ", " ")
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            anchored = "/" in line
            self.rules.append((rel, re.compile(_regex(line.lstrip("/"), anchored)),
                               negated, dir_only))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        """Whether the path ``rel`` (relative to the root) is ignored."""
        verdict = False
        for base, regex, negated, dir_only in self.rules:
            if dir_only and not is_dir:
                continue
            if base:
                if not rel.startswith(base + "/"):
                    continue
                sub = rel[len(base) + 1:]
            else:
                sub = rel
            if regex.fullmatch(sub):
                verdict = not negated
        return verdict


def _regex(pattern: str, anchored: bool) -> str:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:end]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body + "]")
                i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    # a pattern without a slash matches a name at any depth; a match of a directory
    # covers what is below it (the walk does not enter it anyway)
    return body if anchored else "(?:.*/)?" + body


def _is_venv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def walk(root: Root) -> list[tuple[str, str]]:
    """``(path in the root, source path)`` of every file of ``root`` that travels,
    sorted by the first."""
    found: list[tuple[str, str]] = []
    ignore = Ignore()
    top = root.path
    if not os.path.isdir(top):
        raise ShipError(f"the directory {top} to ship does not exist")
    ignore.read(top, "")
    for dirpath, dirnames, filenames in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/")
        if rel_dir:
            ignore.read(dirpath, rel_dir)
        kept = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            full = os.path.join(dirpath, name)
            if not rel_dir and root.only is not None and name not in root.only:
                continue
            if (name in SKIPPED_DIRS or os.path.islink(full) or _is_venv(full)
                    or ignore.ignored(rel, True)):
                continue
            kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            if not rel_dir and root.only is not None and name not in root.only:
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if name.endswith((".pyc", ".pyo")) or ignore.ignored(rel, False):
                continue
            found.append((rel, os.path.join(dirpath, name)))
    found.sort()
    return found
