"""A Griffe extension for fiber's API reference (mkdocs.yml loads it into mkdocstrings'
Python handler; the site is built by ``bash scripts/docs``).

It makes the reference complete and linked, reading nothing but the code:

* **Cross-references become links.** fiber's docstrings cross-reference in Sphinx's
  roles (``:class:`Job```, ``:func:`~fiber.init```), which Markdown would leave as text.
  Each role becomes an optional autorefs reference to the object's full path (a short
  name is resolved in the docstring's own scope, as Python would: the object's
  members, its module's names and imports), so it is a link wherever the site has an
  entry for the target; a standard-library target links to Python's documentation. What
  the site cannot link (a target in fiber's internal modules, which the reference does
  not cover) stays code: ``scripts/docs_hooks.py`` fails the build if a reference to a
  *documented* module was left unlinked.
* **Names made at run time get an entry.** A few public names exist only when the
  program runs (a module ``__getattr__``, a bound method of the default context): each
  name of a module's ``__all__`` that the static reading missed becomes an alias of the
  object that defines it (found by importing the module; :data:`RUNTIME_NAMES` for a
  value that names no definition), so it is rendered with its signature and docstring.
* **Re-exported standard-library objects get an entry.** ``fiber.ProcessError`` is
  ``multiprocessing.ProcessError`` (so that code catching one catches the other);
  multiprocessing defines many of its names at run time, where a static reader cannot
  follow them. An alias of fiber's whose target cannot be read is pointed at the
  object's real definition (found by importing it), and the entry says it is the
  standard library's own object, with a link to Python's documentation.
"""

from __future__ import annotations

import builtins
import html
import importlib
import inspect
import re
import sys
import warnings
from typing import Any

import griffe

# fiber's packages: their objects' docstrings are rewritten here
PACKAGES = ("fiber", "fiber_docker", "fiber_ssh", "fiber_slurm", "fiber_k8s")

# public names that exist only at run time and whose value names nothing that
# defines it -> the object that documents them (the others are found by importing)
RUNTIME_NAMES = {
    # the context package's __getattr__ (a property's value: the reduction module)
    "fiber.context.reducer": "fiber.context.factories.Factories.reducer",
    "fiber.reducer": "fiber.context.factories.Factories.reducer",
}

# where the classes that fiber's factories (fiber.Pool(), fiber.Queue()...) make are
CLASS_MODULES = ("fiber.pool", "fiber.queues", "fiber.connection", "fiber.managers",
                 "fiber.synchronize", "fiber.sharedctypes", "fiber.ring")

PYTHON_DOCS = "https://docs.python.org/3/library/"
# standard-library modules documented on a page of their own (others: their package's)
_OWN_PAGES = {"multiprocessing.shared_memory", "concurrent.futures", "os.path",
              "logging.handlers", "logging.config", "importlib.metadata", "unittest.mock",
              "urllib.parse", "urllib.request", "xml.etree.ElementTree",
              "email.message", "collections.abc"}

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`([^`]+)`")


def python_docs_url(path: str) -> str | None:
    """The address of the standard-library object ``path`` in Python's documentation,
    or None if ``path`` is not of the standard library."""
    path = path.removeprefix("builtins.")
    top = path.split(".", 1)[0]
    value = getattr(builtins, top, None)
    if value is not None and top not in sys.stdlib_module_names:
        if isinstance(value, type) and issubclass(value, BaseException):
            return f"{PYTHON_DOCS}exceptions.html#{path}"
        # a built-in function or class; a method of a built-in type
        return f"{PYTHON_DOCS}{'stdtypes' if '.' in path else 'functions'}.html#{path}"
    if top not in sys.stdlib_module_names:
        return None
    parts = path.split(".")
    page = top
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in _OWN_PAGES:
            page = ".".join(parts[:i])
            break
    return f"{PYTHON_DOCS}{page}.html#{path}"


def _real_path(path: str) -> str | None:
    """Where the object that ``path`` names at run time is defined (module and
    qualified name), if it can be imported."""
    module_name, _, attribute = path.rpartition(".")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError):
        return None
    if not (inspect.isclass(value) or inspect.isroutine(value)):
        return None  # a constant, a module, a typing construct: nothing defines it
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    return f"{module}.{qualname}"


class FiberDocs(griffe.Extension):
    """See the module's docstring."""

    def __init__(self) -> None:
        self.linked: set[str] = set()  # standard-library objects given a note already

    # -- run-time names and standard-library re-exports ----------------------------------
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name not in PACKAGES:
            return
        for path, target in RUNTIME_NAMES.items():
            module_path, _, name = path.rpartition(".")
            if module_path.split(".", 1)[0] != pkg.name:
                continue
            module = pkg if module_path == pkg.path else pkg.get_member(
                module_path[len(pkg.path) + 1:])
            module.set_member(name, griffe.Alias(name, target, parent=module))
        for module in _modules(pkg):
            self._retarget_foreign_aliases(module, loader)
        for obj in _objects(pkg):
            self._link_roles(obj)

    def _retarget_foreign_aliases(self, module: griffe.Module,
                                  loader: griffe.GriffeLoader) -> None:
        """Give each name of the module's ``__all__`` (as the imported module has it)
        that the static reading missed an entry: a name made by ``__getattr__``, an
        alias whose target cannot be read (multiprocessing's names made at run time),
        an attribute that is a function or class defined elsewhere (a bound method)."""
        if module.exports is None or module.name == "__main__":
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exports = list(importlib.import_module(module.path).__all__)
        except Exception:  # noqa: BLE001 - a module the docs' Python cannot import
            return
        for name in exports:
            member = module.members.get(name)
            if member is not None:
                if member.is_alias:
                    try:
                        member.final_target  # noqa: B018 (resolves it)
                        continue
                    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                        pass
                elif not member.is_attribute:
                    continue
            real = _real_path(f"{module.path}.{name}")
            if real is None or real == f"{module.path}.{name}":
                continue
            top = real.split(".", 1)[0]
            if top not in loader.modules_collection:
                loader.load(top)
            new = griffe.Alias(name, real, parent=module)
            module.set_member(name, new)
            try:
                found = new.final_target
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            if top not in PACKAGES:
                self._note_standard_library(found, f"{module.path}.{name}", real)

    def _note_standard_library(self, obj: Any, fiber_path: str, real: str) -> None:
        if obj.path in self.linked:
            return
        self.linked.add(obj.path)
        # multiprocessing's documented name (multiprocessing.pool.ThreadPool), not where
        # it is defined (multiprocessing.context.ProcessError is multiprocessing's)
        public = fiber_path.replace("fiber", "multiprocessing", 1)
        if not _same_object(public, real):
            public = real
        url = python_docs_url(public)
        note = (f"The standard library's own `{public}`, re-exported by fiber as it is"
                + (f" ([Python's documentation]({url}))" if url else "") + ".")
        if obj.docstring is None:
            obj.docstring = griffe.Docstring(note, parent=obj)
        else:
            obj.docstring.value = obj.docstring.value.rstrip() + "\n\n" + note

    # -- roles -> links ------------------------------------------------------------------
    def _link_roles(self, obj: griffe.Object) -> None:
        docstring = obj.docstring
        if docstring is None or ":" not in docstring.value:
            return

        def one(match: re.Match[str]) -> str:
            text = match.group(2).strip()
            titled = re.fullmatch(r"(.+?)\s*<([^<>]+)>", text)  # :role:`title <target>`
            if titled:
                shown, target = titled.group(1), titled.group(2).lstrip("~")
            else:
                target = text.lstrip("~").removesuffix("()")
                shown = target.rsplit(".", 1)[-1] if text.startswith("~") else target
                shown += "()" if text.endswith("()") else ""
            code = f'<code class="fiber-role">{html.escape(shown)}</code>'
            full = self._resolve(obj, target)
            if full is None:
                return code
            if full.split(".", 1)[0] in PACKAGES:
                return f'<autoref identifier="{full}" optional>{code}</autoref>'
            url = python_docs_url(full)
            return f'<a href="{url}">{code}</a>' if url else code

        docstring.value = ROLE.sub(one, docstring.value)

    @staticmethod
    def _resolve(obj: griffe.Object, target: str) -> str | None:
        """The full path of ``target`` as written in ``obj``'s docstring."""
        first, _, rest = target.partition(".")
        if first == "fiber" and rest.count(".") >= 1:
            # `fiber.Pool.stats`: fiber.Pool is the default context's factory (a
            # function), the member is the class's (fiber.pool.Pool)
            name, _, member = rest.partition(".")
            for module in CLASS_MODULES:
                value = getattr(importlib.import_module(module), name, None)
                if inspect.isclass(value) and not inspect.isclass(
                        getattr(importlib.import_module("fiber"), name, None)):
                    return f"{module}.{name}.{member}"
        if first in PACKAGES or first in sys.stdlib_module_names or first == "builtins":
            return target
        scope: Any = obj if obj.is_class or obj.is_module else obj.parent
        while scope is not None:
            try:
                found = scope.resolve(first)
            except griffe.NameResolutionError:
                found = None
            if found:
                return found + ("." + rest if rest else "")
            scope = scope.parent
        if hasattr(builtins, first):
            return target
        return None


def _same_object(one: str, other: str) -> bool:
    def value(path: str) -> Any:
        module, _, name = path.rpartition(".")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError):
            return None

    first = value(one)
    return first is not None and first is value(other)


def _modules(module: griffe.Module) -> list[griffe.Module]:
    found = [module]
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            found.extend(_modules(member))  # type: ignore[arg-type]
    return found


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found.extend(_objects(member))  # type: ignore[arg-type]
    return found
