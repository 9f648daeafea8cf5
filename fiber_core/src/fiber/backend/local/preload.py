"""What the local template imports and compiles once, before it serves its first job
(:mod:`fiber.backend.local.forkserver`): the standard modules jobs use and the
installed plugins (:func:`preload`), the modules of the standard library and of fiber
the parent has imported, and the compiled code of the parent's modules whose bytecode
cache is missing or stale and of its main script (:func:`preload_plan`,
:func:`main_source` in the parent; :func:`apply_preload` in the template), which the
jobs' imports then reuse instead of compiling again.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only (importlib.abc is not imported at start-up)
    from importlib.abc import SourceLoader

__all__ = ["apply_preload", "main_source", "module_files", "preload", "preload_plan"]

# Standard modules jobs import after they start (absent ones are fine).
_PRELOAD = ("pkgutil", "encodings.idna")
# The package whose modules the template imports when the parent has (fiber's own).
_OWN_PACKAGE = __name__.split(".")[0]


def preload() -> None:
    """Do once here what every job would do: import the standard modules jobs use and
    load the plugins (scanning the installed distributions' entry points takes
    milliseconds). Failures are left for the jobs, which report them to their parent."""
    import importlib

    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    try:
        from fiber.backend import registry  # the backend's own package

        registry.quiet_in_jobs()  # the program's main process warns of broken plugins
        registry.plugin_manager()
    except Exception:  # noqa: BLE001 - a broken plugin fails in the job, reported there
        pass


# modules of the standard library whose import has effects a job must have itself
_NOT_PRELOADED = frozenset({
    "__main__", "__hello__", "__phello__", "antigravity", "this", "readline",
    "rlcompleter", "idlelib", "tkinter", "turtle", "turtledemo", "pydoc", "site",
    "sitecustomize", "usercustomize", "test", "pdb", "getpass", "tty", "pty", "curses",
})
_MAX_SOURCE_BYTES = 16 << 20


def _stdlib_dir() -> str:
    return os.path.dirname(os.__file__)


def _stale_bytecode(source: str) -> bool:
    import importlib.util

    try:
        pyc = importlib.util.cache_from_source(source)
        return os.stat(pyc).st_mtime < os.stat(source).st_mtime
    except (OSError, NotImplementedError, ValueError):
        return True


def module_files(modules: Sequence[str]) -> list[tuple[str, str]]:
    """``[(name, file)]`` of ``modules`` as this process would import them (the jobs'
    own module, for the template to import before its first fork)."""
    import importlib.util

    found = []
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin:
            found.append((name, spec.origin))
    return found


def preload_plan(
    modules: Mapping[str, types.ModuleType] | None = None,
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """In the parent: the standard library modules and fiber's own modules it has
    imported, and its other modules whose bytecode cache is missing or older than the
    source, both as ``[(name, file)]``."""
    from importlib.machinery import SourceFileLoader

    stdlib = _stdlib_dir() + os.sep
    names: list[tuple[str, str]] = []
    sources: list[tuple[str, str]] = []
    for name, module in list((modules if modules is not None else sys.modules).items()):
        spec = getattr(module, "__spec__", None)
        origin: str | None = getattr(spec, "origin", None)
        if not origin or not os.path.isabs(origin) or name in _NOT_PRELOADED:
            continue
        top = name.split(".")[0]
        if top == _OWN_PACKAGE or (origin.startswith(stdlib)
                                   and "-packages" not in origin[len(stdlib):]):
            if top not in _NOT_PRELOADED:
                names.append((name, origin))
        elif isinstance(getattr(spec, "loader", None), SourceFileLoader) and _stale_bytecode(origin):
            sources.append((name, origin))
    return names, sources


_compiled: dict[str, tuple[bytes, types.CodeType]] = {}


_SourceToCode = Callable[..., types.CodeType]


def _cached_source_to_code(original: _SourceToCode) -> _SourceToCode:
    def source_to_code(self: SourceLoader, data: bytes, path: str, *,
                       _optimize: int = -1) -> types.CodeType:
        hit = _compiled.get(path)
        if hit is not None and _optimize == -1 and hit[0] == data:
            return hit[1]  # compiled from these very bytes, with the same flags
        return original(self, data, path, _optimize=_optimize)

    return source_to_code


def main_source(main: types.ModuleType | None = None) -> list[tuple[str, str]]:
    """In the parent: its main script's file, for the template to compile once
    (``[("", path)]``: no module name, as imports here cannot clash with it; the path
    as multiprocessing's preparation data names it; ``[]`` when the main module is not
    a Python source file). Python never caches
    a script's bytecode, so without this every job compiles it again."""
    main = main if main is not None else sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not path.endswith(".py"):
        return []
    path = os.path.normpath(os.path.abspath(path))
    return [("", path)] if os.path.isfile(path) else []


_CodeFromFile = Callable[..., Any]


def _cached_code_from_file(original: _CodeFromFile) -> _CodeFromFile:
    """runpy's private ``_get_code_from_file`` (``run_path``'s compile of a script,
    which is how a job imports its parent's main script), answered from the code this
    template compiled when the file's bytes are the same. Its signature and return
    differ by version (``(run_name, fname) -> (code, fname)`` before 3.13, ``(fname)
    -> code`` since): the file is the last argument, and a hit is returned in the
    shape the original returns."""

    def get_code_from_file(*args: Any) -> Any:
        fname = args[-1]
        hit = _compiled.get(fname) if isinstance(fname, str) else None
        if hit is not None:
            try:
                with open(fname, "rb") as f:
                    same = f.read() == hit[0]
            except OSError:
                same = False
            if same:
                return (hit[1], fname) if len(args) == 2 else hit[1]
        return original(*args)

    get_code_from_file.fiber_cached = True  # type: ignore[attr-defined]
    return get_code_from_file


def apply_preload(names: list[tuple[str, str]], sources: list[tuple[str, str]]) -> None:
    """In the template: import ``names`` (each only if it resolves to the same file
    as in the parent), compile the files of ``sources`` not imported here for the
    jobs' imports to reuse."""
    import importlib
    import importlib.util
    from importlib.machinery import SourceFileLoader

    total = 0
    for name, path in sources:
        if name and name in sys.modules:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
            total += len(data)
            if total > _MAX_SOURCE_BYTES:
                break
            _compiled[path] = (data, compile(data, path, "exec", dont_inherit=True))
        except (OSError, SyntaxError, ValueError):
            continue
    if _compiled and "source_to_code" not in SourceFileLoader.__dict__:
        SourceFileLoader.source_to_code = _cached_source_to_code(  # type: ignore[method-assign]  # the template's loaders reuse its compiled code on purpose
            SourceFileLoader.source_to_code)
    # private: see _cached_code_from_file; a Python without it compiles as before
    get_code = getattr(runpy, "_get_code_from_file", None)
    if _compiled and get_code is not None and not getattr(get_code, "fiber_cached", False):
        runpy._get_code_from_file = _cached_code_from_file(get_code)  # type: ignore[attr-defined]
    with warnings.catch_warnings():
        # a deprecated module warned in the parent already; not once more from here
        warnings.simplefilter("ignore")
        for name, origin in names:
            if name in sys.modules:
                continue
            try:
                spec = importlib.util.find_spec(name)
                if spec is not None and spec.origin == origin:
                    importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the job imports it itself if it needs it
                continue
