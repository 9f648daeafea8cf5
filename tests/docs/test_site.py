"""The built documentation site (``site/``, made by ``bash scripts/docs``; the lint tox
env builds it and then runs these tests): the API reference has an entry for every
public name, and the docstrings' cross-references became links.

The site is the real build of this checkout, nothing is faked; without one (``site/``
missing, or older than a page or the code) the tests fail and say to build it.
"""

from __future__ import annotations

import importlib
import re
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site"

# every public module of fiber-core and of the plugins must have a page of the API
# reference (a `::: module` block in docs/api/): multiprocessing's counterparts,
# fiber's own, and each plugin's package and settings module
PUBLIC_MODULES = [
    "fiber", "fiber.process", "fiber.context", "fiber.queues", "fiber.connection",
    "fiber.pool", "fiber.managers", "fiber.synchronize", "fiber.sharedctypes",
    "fiber.shared_memory", "fiber.reduction", "fiber.util", "fiber.dummy", "fiber.ring",
    "fiber.experimental", "fiber.meta", "fiber.errors", "fiber.config",
    "fiber.runtime.config", "fiber.backend",
    "fiber_docker", "fiber_docker.plugin", "fiber_ssh", "fiber_ssh.plugin",
    "fiber_slurm", "fiber_slurm.plugin", "fiber_k8s", "fiber_k8s.plugin",
]


def _api_blocks() -> list[str]:
    return [path for page in sorted((ROOT / "docs" / "api").glob("*.md"))
            for path in re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), re.M)]


def _built() -> Path:
    inventory = SITE / "objects.inv"
    if not inventory.exists():
        pytest.fail("no built site: run `bash scripts/docs` first (the lint env does)")
    sources = [*ROOT.glob("docs/**/*.md"), *ROOT.glob("fiber_core/src/fiber/**/*.py"),
               *ROOT.glob("plugins/*/src/*/*.py")]
    newest = max(source.stat().st_mtime for source in sources)
    if inventory.stat().st_mtime < newest:
        pytest.fail("site/ is older than docs/ or the code: run `bash scripts/docs` again")
    return inventory


def inventory_names(path: Path) -> set[str]:
    """The objects of a Sphinx inventory (objects.inv, version 2): their names."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):  # four lines of header, then the zlib-compressed body
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2")
    body = zlib.decompress(data[header_end:]).decode("utf-8")
    return {line.split(" ", 1)[0] for line in body.splitlines() if line.strip()}


def test_every_public_module_has_an_api_page() -> None:
    blocks = set(_api_blocks())
    missing = [module for module in PUBLIC_MODULES if module not in blocks]
    assert not missing, f"public modules with no `::: module` block in docs/api/: {missing}"


def public_names(module_name: str) -> list[str]:
    """A module's public names: its ``__all__`` as the imported module has it, or
    else the classes and functions it defines."""
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return [n for n in module.__all__ if n != "__version__"]
    return [n for n, v in vars(module).items() if not n.startswith("_")
            and getattr(v, "__module__", None) == module_name and callable(v)]


def test_inventory_has_every_public_name() -> None:
    """Every public name of each public module is an object of the site's inventory,
    so it has an entry and can be linked (from this site and, through objects.inv, from
    any other)."""
    names = inventory_names(_built())
    assert len(names) > 500
    missing: list[str] = []
    for module_name in PUBLIC_MODULES:
        assert module_name in names, f"module {module_name} has no entry"
        missing += [f"{module_name}.{n}" for n in public_names(module_name)
                    if f"{module_name}.{n}" not in names]
    assert not missing, f"public names without an entry in the API reference: {missing}"
    # the names issue #42 found missing: all of fiber.__all__ (48 names) is there now
    assert len(public_names("fiber")) >= 48
    assert {"fiber.get_context", "fiber.reducer", "fiber.ProcessError",
            "fiber.TimeoutError", "fiber.log_to_stderr"} <= names


def test_cross_references_to_public_names_are_links() -> None:
    """scripts/docs_griffe.py turns each Sphinx role of a docstring into a reference:
    one whose target is a public name of a public module (or a member of one) must
    have become a link. What is left as code names an internal module (fiber.runtime,
    fiber.wire, ...), which the reference does not cover."""
    _built()
    public = {module: set(public_names(module)) for module in PUBLIC_MODULES}
    linked, unlinked = 0, []
    for page in sorted((SITE / "api").glob("*.html")):
        html = page.read_text(encoding="utf-8")
        linked += len(re.findall(r'<a [^>]*href="[^"]*"[^>]*><code class="fiber-role">', html))
        for target in re.findall(r'<span title="([^"]+)"><code class="fiber-role">', html):
            owner = max((m for m in public if target.startswith(m + ".")), key=len, default=None)
            if owner is not None and target[len(owner) + 1:].split(".")[0] in public[owner]:
                unlinked.append(f"{page.name}: {target}")
    assert linked > 200
    assert not unlinked, f"cross-references to public names left unlinked: {unlinked}"
