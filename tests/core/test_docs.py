"""The documentation: README stays a first visit's page (under 200 lines, its two
commands intact, every link resolving) and the site's configuration page lists every
setting of the registry (scripts/docs_hooks.py generates it; the site itself is built,
strict, by ``bash scripts/docs`` in the lint env).

Nothing is faked: the settings come from the real registry of this environment (the
core's and those of whichever plugins are installed)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

QUICK_START = ("python3 -m venv .venv && .venv/bin/pip install ./fiber_core && "
               ".venv/bin/python examples/pi.py")
TEST_COMMAND = "bash scripts/test"


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail into docs/"


def test_readme_keeps_its_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    commands = [line.strip() for block in blocks for line in block.splitlines()]
    assert QUICK_START in commands  # the quick start, as users copy it
    assert TEST_COMMAND in commands  # .ci/run calls exactly this


def test_readme_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    absent = [p for p in pages if not re.search(rf"^\s*- (.*: )?{re.escape(p)}\s*$", nav, re.M)]
    assert not absent, f"pages of docs/ missing from mkdocs.yml's nav: {absent}"


def test_configuration_page_lists_every_setting() -> None:
    from fiber.backend import registry
    from fiber.runtime.config import CORE_OPTIONS

    table = _hooks().settings_markdown()
    options = [*CORE_OPTIONS, *registry.config_options()]
    assert len(options) > 10
    for option in options:
        row = f"| `{option.name}` | `{option.env_var}` |"
        assert row in table, f"setting {option.name} is missing from the generated table"
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert "<!-- fiber:settings -->" in page  # where the hook puts the table


def test_backend_page_table_is_the_declaration() -> None:
    from fiber.backend.local.backend import LocalBackend

    table = _hooks().backend_markdown("local")
    assert "| package | `fiber-core` |" in table
    accepted = ", ".join(f"`{f}`" for f in sorted(LocalBackend.resource_fields))
    assert f"| `fiber.Resources` requests it accepts | {accepted} |" in table
    assert "`local_start_method`" in table
    for page in ("local", "docker", "ssh", "slurm", "kubernetes"):
        text = (ROOT / "docs" / "backends" / f"{page}.md").read_text(encoding="utf-8")
        assert f"<!-- fiber:backend {page} -->" in text


def test_backend_authors_page_table_is_the_contract() -> None:
    """The table of docs/writing-a-backend.md has one row for every public method and
    attribute of ``Backend``, the required ones (its abstract methods and
    ``secrets_delivery``) first and marked so, every other one not."""
    import inspect

    from fiber.backend.base import REQUIRED, Backend

    table = _hooks().contract_markdown()
    rows = [row for row in table.splitlines() if row.startswith("| `")]
    names = [re.match(r"\| `(\w+)", row).group(1) for row in rows]  # type: ignore[union-attr]
    public = [name for name, value in Backend.__dict__.items() if not name.startswith("_")
              and (inspect.isfunction(value) or name in Backend.__annotations__)]
    assert sorted(names) == sorted(public) and len(names) == len(set(names)), names
    assert set(REQUIRED) == {*Backend.__abstractmethods__, "secrets_delivery"}
    assert names[:len(REQUIRED)] == list(REQUIRED)
    for name, row in zip(names, rows, strict=True):
        assert ("| **yes** |" in row) == (name in REQUIRED), row
    page = (ROOT / "docs" / "writing-a-backend.md").read_text(encoding="utf-8")
    assert "<!-- fiber:contract -->" in page  # where the hook puts the table


PACKAGE_DIRS = ["fiber_core", "plugins/fiber-docker", "plugins/fiber-ssh",
                "plugins/fiber-slurm", "plugins/fiber-k8s"]


def test_license_is_apache_and_every_package_ships_it() -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    for directory in PACKAGE_DIRS:
        # the package's own LICENSE (a link to the repository's) goes into its sdist and
        # wheel: scripts/wheels.py checks the built files
        assert (ROOT / directory / "LICENSE").read_text(encoding="utf-8") == license_text
        pyproject = (ROOT / directory / "pyproject.toml").read_text(encoding="utf-8")
        assert re.search(r'^license = "Apache-2.0"$', pyproject, re.M), directory
        assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, re.M), directory


def test_changelog_has_an_unreleased_section_and_says_how_to_add() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", changelog, re.M)
    assert sections and sections[0] == "Unreleased"
    assert "CONTRIBUTING.md#the-changelog" in changelog
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert "## The changelog" in contributing
    for page, source in (("changelog.md", "CHANGELOG.md"), ("contributing.md", "CONTRIBUTING.md")):
        assert f"<!-- fiber:include {source} -->" in (ROOT / "docs" / page).read_text()


def test_documentation_tools_are_pinned() -> None:
    pins = (ROOT / "scripts" / "docs-requirements.txt").read_text(encoding="utf-8")
    lines = [line for line in pins.splitlines() if line.strip() and not line.startswith("#")]
    names = set()
    for line in lines:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[a-z,]+\])?==[0-9][0-9a-z.]*", line.strip())
        assert match, f"not an exact pin: {line!r}"
        names.add(match.group(1).lower())
    assert {"mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "griffe",
            "mkdocs-autorefs", "markdown", "pymdown-extensions", "pygments"} <= names
    tox = (ROOT / "tox.ini").read_text(encoding="utf-8")
    lint = tox.split("[testenv:lint]", 1)[1].split("\n[", 1)[0]
    assert "-r scripts/docs-requirements.txt" in lint
    assert not re.search(r"^\s+mkdocs", lint, re.M), "a documentation tool unpinned in tox.ini"
    assert "scripts/docs-requirements.txt" in (ROOT / "scripts" / "docs").read_text()


def test_site_footer_names_every_package_version() -> None:
    footer = _hooks().version_footer()
    for directory in PACKAGE_DIRS:
        version_file = next((ROOT / directory / "src").glob("*/_version.py"))
        found = re.search(r'__version__ = "([^"]+)"', version_file.read_text())
        assert found is not None
        version = found.group(1)
        name = "fiber-core" if directory == "fiber_core" else Path(directory).name
        assert f"{name} {version}" in footer
    assert "Apache License 2.0" in footer


def test_site_check_finds_what_breaks_from_disk(tmp_path: Path) -> None:
    """scripts/docs_hooks.py's check, run on every build, on a small site made here:
    a link to a folder (what use_directory_urls made), a missing page, a script from a
    CDN and a 404 page whose links miss the site's path are each found; a good site
    has no problem."""
    site_problems = _hooks().site_problems
    (tmp_path / "api").mkdir()
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "app.js").write_text("")
    (tmp_path / "api" / "pool.html").write_text(
        '<a href="../index.html#top">home</a><script src="../assets/app.js"></script>'
        '<a href="https://example.org/">elsewhere</a>')
    (tmp_path / "index.html").write_text('<a href="api/pool.html">pool</a>')
    (tmp_path / "404.html").write_text('<link rel="stylesheet" href="/assets/app.js">')
    assert site_problems(tmp_path) == []
    (tmp_path / "index.html").write_text(
        '<a href="api/">folder</a><a href="gone.html">gone</a>'
        '<script src="https://cdn.example.org/x.js"></script>')
    problems = site_problems(tmp_path)
    assert problems == ["index.html: href=api/ is a folder",
                        "index.html: href=gone.html is missing",
                        "index.html: loads https://cdn.example.org/x.js from another host"]
    (tmp_path / "index.html").write_text('<a href="api/pool.html">pool</a>')
    assert site_problems(tmp_path, "https://example.org/fiber/") == [
        "404.html: /assets/app.js is outside the site's path /fiber/"]
