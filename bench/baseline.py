"""fiber from another commit as a contender: ``python -m bench run --baseline REV``.

The benchmark compares contenders in one run, interleaved; to compare fiber with an
older fiber in the same run, the older one is a contender of its own, ``fiber@REV``.
:func:`prepare` makes a detached git worktree of ``REV`` in a cache directory outside
the checkout (``/var/cache/fiber/bench-baseline/<short sha>``, or
``$BENCH_BASELINE_CACHE``; reused when it is there and at that commit) and
writes, beside it (``<short sha>.dist``), the packaging metadata of that tree's
distributions (``fiber-core``, and the plugins installed in this environment): their
names, versions and ``fiber`` entry points, as that commit's pyproject.toml files
declare them (the entry points of the local backend changed with the plugin contract
of #27: the installed metadata names an object the old module does not have).

A ``fiber@REV`` benchmark process runs with :func:`pythonpath` in front of
``PYTHONPATH``: the metadata directory first (so that the entry points fiber's backend
registry loads are that commit's: the entry point of an installed distribution of the
same name and entry-point name is then skipped), then the old tree's ``fiber_core/src``
and plugin sources. Everything that process starts (the local backend's template and
workers, fresh interpreters) inherits the environment, so it runs the old code too.
Only the harness (``bench/``) is this checkout's.

Local backend only: a cluster backend's jobs get fiber from their image or host, not
from this machine's ``PYTHONPATH``.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger("fiber.bench")

REPO = Path(__file__).resolve().parent.parent
CACHE_ENV = "BENCH_BASELINE_CACHE"  # not FIBER_*: fiber reads those as its settings
DEFAULT_CACHE = Path("/var/cache/fiber/bench-baseline")
PREFIX = "fiber@"
SHORT = 7  # characters of the commit's hash in the contender's name and directory
SOURCES = "sources.txt"  # in the metadata directory: the tree's source directories used


def cache_root() -> Path:
    """Where baseline trees live (never inside the checkout)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def is_baseline(name: str) -> bool:
    """Whether ``name`` is a baseline contender's (``fiber@REV``)."""
    return name.startswith(PREFIX)


def name_of(short: str) -> str:
    return PREFIX + short


def tree(short: str) -> Path:
    """The worktree of the commit whose short hash is ``short``."""
    return cache_root() / short


def metadata_dir(short: str) -> Path:
    """The directory of that commit's distribution metadata (beside its tree)."""
    return cache_root() / f"{short}.dist"


def pythonpath(name: str) -> list[str]:
    """The ``PYTHONPATH`` entries, in order, that make a process import the baseline
    contender ``name``'s fiber (and plugins)."""
    short = name[len(PREFIX):]
    listed = metadata_dir(short) / SOURCES
    sources = listed.read_text().split("\n") if listed.exists() else []
    return [str(metadata_dir(short)), *filter(None, sources)]


def missing(name: str) -> str | None:
    """Why the baseline contender ``name`` cannot run, or None."""
    short = name[len(PREFIX):]
    if not (tree(short) / "fiber_core" / "src" / "fiber" / "__init__.py").exists():
        return (f"no baseline tree at {tree(short)}: run with `--baseline {short}` "
                "(it makes the tree)")
    if not metadata_dir(short).is_dir():
        return f"no baseline metadata at {metadata_dir(short)}: run with `--baseline {short}`"
    return None


def _git(*args: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"`git {' '.join(args)}` failed in {cwd}: "
                           f"{done.stderr.strip()[-500:]}")
    return done.stdout.strip()


def prepare(rev: str, repo: Path = REPO) -> str:
    """Make (or reuse) the tree and metadata of ``rev``; return the contender's name.

    Raises ``ValueError`` when ``rev`` names no commit of ``repo``, ``RuntimeError``
    when git cannot make the worktree."""
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=repo)
    except RuntimeError:
        raise ValueError(f"--baseline {rev!r}: not a commit of {repo}") from None
    short = sha[:SHORT]
    root = tree(short)
    if root.exists():
        try:
            at = _git("rev-parse", "HEAD", cwd=root)
        except RuntimeError:
            at = ""
        if at != sha:
            raise RuntimeError(f"{root} exists but is not a worktree at {sha} (it is at "
                               f"{at or 'no commit'}): remove it, then run again")
        logger.info("baseline %s: reusing %s", short, root)
    else:
        root.parent.mkdir(parents=True, exist_ok=True)
        _git("worktree", "add", "--detach", str(root), sha, cwd=repo)
        logger.info("baseline %s: made a detached worktree at %s", short, root)
    write_metadata(root, metadata_dir(short))
    same_bytecode(pythonpath(name_of(short))[1:], [str(p) for p in checkout_sources(repo)])
    return name_of(short)


def checkout_sources(repo: Path = REPO) -> list[Path]:
    """This checkout's source directories of fiber-core and the plugins."""
    return [repo / "fiber_core" / "src", *sorted(repo.glob("plugins/*/src"))]


def same_bytecode(old: list[str], new: list[str]) -> None:
    """Both fibers import under the same conditions: when this interpreter writes byte
    code, both trees are compiled now (not in a first timed start); when it does not
    (``PYTHONDONTWRITEBYTECODE``, ``-B``), the baseline tree's cached byte code is
    removed, so that both compile their modules at every import, as this checkout's
    does then."""
    if sys.dont_write_bytecode:
        for src in old:
            for cache in Path(src).rglob("__pycache__"):
                shutil.rmtree(cache, ignore_errors=True)
        logger.info("no byte code written (PYTHONDONTWRITEBYTECODE): neither fiber has any")
        return
    for src in [*old, *new]:
        compileall.compile_dir(src, quiet=1)


def _version(src: Path, package: str) -> str:
    """A package's ``__version__`` as its ``_version.py`` spells it, or 0.0.0."""
    path = src / package / "_version.py"
    if path.exists():
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", path.read_text())
        if m:
            return m.group(1)
    return "0.0.0"


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def write_metadata(root: Path, out: Path) -> list[Path]:
    """One ``.dist-info`` directory in ``out`` per distribution of the tree at ``root``
    (``fiber_core`` and ``plugins/*``) that is installed in this environment: name,
    version and the ``fiber`` entry points of its pyproject.toml; and the list of their
    source directories (:data:`SOURCES`). Returns the directories written.

    A plugin not installed here is left out, as for the ``fiber`` contender; one
    installed here but not in the old tree stays this checkout's."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise RuntimeError("--baseline reads pyproject.toml with tomllib: run the "
                           "benchmark with Python 3.11 or later") from None
    shutil.rmtree(out, ignore_errors=True)  # written afresh: what is installed may change
    out.mkdir(parents=True)
    written = []
    sources = []
    projects = [root / "fiber_core", *sorted((root / "plugins").glob("*"))]
    for project in projects:
        toml = project / "pyproject.toml"
        if not toml.exists():
            continue
        meta = tomllib.loads(toml.read_text())["project"]
        name = meta["name"]
        if project.name != "fiber_core" and not _installed(name):
            continue
        sources.append(str(project / "src"))
        eps = meta.get("entry-points", {}).get("fiber", {})
        packages = [p.name for p in (project / "src").glob("*") if (p / "__init__.py").exists()]
        version = _version(project / "src", packages[0]) if packages else "0.0.0"
        dist = out / f"{name.replace('-', '_')}-{version}.dist-info"
        dist.mkdir(exist_ok=True)
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            f"Summary: {name} from the baseline tree {root} (bench/baseline.py)\n")
        (dist / "entry_points.txt").write_text(
            "[fiber]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
        written.append(dist)
    (out / SOURCES).write_text("\n".join(sources) + "\n")
    return written
