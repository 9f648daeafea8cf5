"""MkDocs hooks of fiber's documentation site (mkdocs.yml ``hooks:``; built by
``bash scripts/docs``).

They put into the site what lives outside ``docs/`` so that it has one source:

* ``<!-- fiber:settings -->`` in a page becomes the table of every setting, generated
  from the settings registry (``fiber.runtime.config.CORE_OPTIONS`` and every
  installed plugin's ``Plugin.options``), so no setting is ever missing from it
  (``tests/core/test_docs.py`` checks that);
* ``<!-- fiber:backend NAME -->`` becomes what the backend NAME declares (the
  requests it accepts, its capabilities, its secret delivery, its settings);
* ``<!-- fiber:contract -->`` becomes the table of what a backend implements, required
  and optional, generated from :class:`fiber.backend.Backend` itself (its abstract
  methods and ``fiber.backend.base.REQUIRED``, each method's docstring, each
  attribute's ``#:`` comment and default), so that it cannot drift from the contract;
* ``<!-- fiber:code PATH -->`` becomes the repository file PATH as a collapsible block
  of code (the examples page shows each example so);
* ``<!-- fiber:include PATH -->`` becomes the repository file PATH (a plugin's
  README.md, bench/RESULTS.md), its relative links rewritten to the site's pages;
* the benchmark's result pages and plots (``bench/**``) are added to the site at the
  same paths as in the repository, so README-style links to them resolve;
* an API page (``docs/api/``) opens with the table of its names, each linked to its
  entry, from the modules' ``__all__`` (the ``public_names`` of each ``:::`` block);
* every page's footer names the version of each package (their ``_version.py``);
* after the build, every page's links and resources are checked to work opened from
  disk and offline (``site_problems``): a link to a folder, a missing file or a
  script from another host fails the build;
* ``examples/quickstart.ipynb`` becomes the page ``quickstart.md`` (its markdown cells,
  its code cells and the outputs stored in the notebook, its images as PNG files):
  lighter than a notebook plugin, which would pull nbconvert and a kernel into the build.

The generating functions import nothing of MkDocs, so a test can call them.
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"

# a repository path of a link -> the site page it became (relative to docs/)
_MOVED = {
    "README.md": "index.md",
    "CHANGELOG.md": "changelog.md",
    "CONTRIBUTING.md": "contributing.md",
    "plugins/fiber-docker/README.md": "backends/docker.md",
    "plugins/fiber-ssh/README.md": "backends/ssh.md",
    "plugins/fiber-slurm/README.md": "backends/slurm.md",
    "plugins/fiber-k8s/README.md": "backends/kubernetes.md",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("[", "\\[")


def _default(option: Any) -> str:
    if option.default is None:
        return "none"
    if isinstance(option.default, bool):
        return f"`{str(option.default).lower()}`"
    return f"`{option.default}`"


def settings_markdown() -> str:
    """The table of every setting of the registry: core settings first, then each
    installed plugin's, with its environment variable, default and help."""
    from fiber.backend import registry
    from fiber.runtime.config import CORE_OPTIONS

    rows = ["| setting | environment | default | from | meaning |", "|---|---|---|---|---|"]
    seen: set[str] = set()
    groups: list[tuple[str, list[Any]]] = [("fiber-core", list(CORE_OPTIONS))]
    for plugin in registry.plugins():
        groups.append((plugin.package, list(plugin.options)))
    for source, options in groups:
        for option in options:
            if option.name in seen:
                continue
            seen.add(option.name)
            choices = ""
            if option.choices:
                choices = " (one of " + ", ".join(f"`{c}`" for c in option.choices) + ")"
            rows.append(f"| `{option.name}` | `{option.env_var}` | {_cell(_default(option))} "
                        f"| {source} | {_cell(option.help)}{choices} |")
    return "\n".join(rows) + "\n"


def backend_markdown(name: str) -> str:
    """What the backend ``name`` declares, read from its class and its plugin: the
    ``fiber.Resources`` requests it accepts (others are refused with ``ConfigError``
    before any job starts), the ``extra`` keys it takes, its optional capabilities, how
    it delivers the run's secret, and its own settings."""
    import importlib

    from fiber.backend import registry

    for plugin in registry.plugins():
        if name in plugin.backends:
            break
    else:
        raise LookupError(f"no installed plugin declares the backend {name!r}")
    module, _, attribute = plugin.backends[name].partition(":")
    cls = getattr(importlib.import_module(module), attribute)

    def names(values: Any) -> str:
        return ", ".join(f"`{v}`" for v in sorted(values)) or "none"

    rows = [
        "| | |", "|---|---|",
        f"| package | `{plugin.package}` |",
        f"| `fiber.Resources` requests it accepts | {names(cls.resource_fields)} |",
        f"| `extra={{\"{name}\": {{...}}}}` keys | {names(cls.resource_extras)} |",
        f"| optional capabilities | {names(cls.capabilities)} |",
        f"| how the run's secret reaches a job | `{cls.secrets_delivery}` |",
        f"| its settings | {names(o.name for o in plugin.options)} |",
    ]
    return ("Generated from the backend's declaration (`" + plugin.backends[name]
            + "` and its `fiber.backend.Plugin`); a request it does not accept is "
            "refused with `ConfigError` before any job starts. Its settings are "
            "described in [configuration](" + "../configuration.md" + ").\n\n"
            + "\n".join(rows) + "\n")


def _first_sentence(text: str) -> str:
    """The first sentence of a docstring or comment, on one line."""
    flat = " ".join(text.split())
    match = re.search(r"(?<=[a-z)`])\. (?=[A-Z`])", flat)
    return flat[:match.start() + 1] if match else flat


def _attribute_comments() -> dict[str, str]:
    """Each attribute of :class:`Backend` with the ``#:`` comment above it in base.py."""
    import inspect

    from fiber.backend.base import Backend

    comments: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(Backend).splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            block.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if block and match:
            comments[match.group(1)] = " ".join(block)
        block = []
    return comments


def contract_markdown() -> str:
    """The table of the backend contract: every public method and attribute of
    :class:`fiber.backend.Backend`, the required ones first (its abstract methods and
    ``fiber.backend.base.REQUIRED``), each with its default and the first sentence of
    its documentation."""
    import inspect

    from fiber.backend.base import REQUIRED, Backend

    comments = _attribute_comments()
    members: list[tuple[str, bool, str, str]] = []  # label, required, default, what
    order: dict[str, int] = {}  # the required ones in REQUIRED's order
    for name, value in Backend.__dict__.items():
        if name.startswith("_"):
            continue
        required = name in REQUIRED
        order[name] = REQUIRED.index(name) if required else len(REQUIRED)
        if inspect.isfunction(value):
            parameters = [p.name if p.default is inspect.Parameter.empty
                          else f"{p.name}={p.default!r}"
                          for p in inspect.signature(value).parameters.values()][1:]
            signature = f"({', '.join(parameters)})"
            default = "none: implement it" if required else "`Backend`'s works"
            what = _first_sentence(inspect.getdoc(value) or "")
            members.append((f"`{name}{signature}`", required, default, what))
        elif name in Backend.__annotations__:
            default = ("none: set it" if required else f"`{value!r}`")
            members.append((f"`{name}`", required, default,
                            _first_sentence(comments.get(name, ""))))
    members.sort(key=lambda member: order[re.split(r"[`(]", member[0])[1]])
    rows = ["| member | required | default | what it is |", "|---|---|---|---|"]
    for label, required, default, what in members:
        what = re.sub(r":(?:meth|attr|class|data|mod):`~?([^`]+)`", r"`\1`", what)
        rows.append(f"| {label} | {'**yes**' if required else 'no'} | {_cell(default)} "
                    f"| {_cell(what)} |")
    return ("Generated from `fiber.backend.Backend` (`fiber_core/src/fiber/backend/"
            "base.py`): its abstract methods and `secrets_delivery` are required "
            "(`fiber.backend.base.REQUIRED`); everything else has a working default.\n\n"
            + "\n".join(rows) + "\n")


def _rewrite_links(text: str, source: str, page: str) -> str:
    """Relative links of the repository file ``source`` as seen from the site page
    ``page`` (both relative to their roots)."""
    src_dir = Path(source).parent
    page_depth = len(Path(page).parent.parts)

    def fix(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:|#|/", target):
            return match.group(0)
        path, _, anchor = target.partition("#")
        repo_path = Path(*[p for p in (src_dir / path).parts])
        parts: list[str] = []
        for part in repo_path.parts:
            if part == "..":
                if parts:
                    parts.pop()
            elif part != ".":
                parts.append(part)
        resolved = "/".join(parts)
        if resolved in _MOVED:
            resolved = _MOVED[resolved]
        elif resolved.startswith("docs/"):
            resolved = resolved[len("docs/"):]
        new = "../" * page_depth + resolved + ("#" + anchor if anchor else "")
        return f"{match.group(1)}({new})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", fix, text)


def _shift_headings(text: str, levels: int) -> str:
    out, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            line = "#" * levels + line
        out.append(line)
    return "\n".join(out)


def include(markdown: str, page: str) -> str:
    """Replace each ``<!-- fiber:include PATH -->`` of ``markdown`` (the page
    ``page``) with the repository file PATH, its links rewritten;
    ``<!-- fiber:include PATH +N -->`` also moves its headings N levels down."""
    def one(match: re.Match[str]) -> str:
        source = match.group(1)
        text = (ROOT / source).read_text(encoding="utf-8")
        text = _rewrite_links(text, source, page)
        return _shift_headings(text, int(match.group(2) or 0))

    return re.sub(r"<!-- fiber:include (\S+)(?: \+(\d))? -->", one, markdown)


def notebook_markdown(path: Path = NOTEBOOK) -> tuple[str, dict[str, bytes]]:
    """The notebook as a markdown page and the images of its outputs (name -> PNG)."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out: list[str] = []
    images: dict[str, bytes] = {}
    note = (f"*This page is `examples/{path.name}`, rendered with the outputs stored "
            "in it; CI executes it on a Jupyter kernel "
            "(`tests/examples/test_quickstart_notebook.py`).*\n")
    for cell in nb["cells"]:
        source = "".join(cell.get("source", ""))
        if cell["cell_type"] == "markdown":
            out.append(source + "\n")
            if note:  # under the notebook's title
                out.append(note)
                note = ""
            continue
        if cell["cell_type"] != "code":
            continue
        out.append("```python\n" + source + "\n```\n")
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                # a progress bar redraws its line with carriage returns: its last frame
                text = "\n".join(line.rsplit("\r", 1)[-1]
                                 for line in "".join(output.get("text", "")).split("\n"))
                if text.strip():
                    out.append("```text\n" + text.rstrip("\n") + "\n```\n")
            elif kind in ("execute_result", "display_data"):
                data = output.get("data", {})
                if "image/png" in data:
                    name = f"quickstart-{len(images) + 1}.png"
                    images[name] = base64.b64decode("".join(data["image/png"]))
                    out.append(f"![output]({name})\n")
                elif "text/plain" in data:
                    out.append("```text\n" + "".join(data["text/plain"]).rstrip("\n")
                               + "\n```\n")
            elif kind == "error":
                out.append("```text\n" + output.get("ename", "") + ": "
                           + output.get("evalue", "") + "\n```\n")
    return "\n".join(out), images


# the packages whose documentation the site is: (distribution, its _version.py)
PACKAGES = [
    ("fiber-core", "fiber_core/src/fiber/_version.py"),
    ("fiber-docker", "plugins/fiber-docker/src/fiber_docker/_version.py"),
    ("fiber-ssh", "plugins/fiber-ssh/src/fiber_ssh/_version.py"),
    ("fiber-slurm", "plugins/fiber-slurm/src/fiber_slurm/_version.py"),
    ("fiber-k8s", "plugins/fiber-k8s/src/fiber_k8s/_version.py"),
]


def versions() -> dict[str, str]:
    """Each package's version, as its ``_version.py`` (the one place it is written)
    says."""
    found = {}
    for name, path in PACKAGES:
        match = re.search(r'^__version__ = "([^"]+)"', (ROOT / path).read_text(), re.M)
        if match is None:
            raise LookupError(f"no __version__ in {path}")
        found[name] = match.group(1)
    return found


def version_footer() -> str:
    """The site's footer: the version of every package it documents, and the license."""
    found = versions()
    plugins = ", ".join(f"{name} {v}" for name, v in found.items() if name != "fiber-core")
    return (f"fiber {found['fiber-core']}: the documentation of fiber-core "
            f"{found['fiber-core']} and of the plugins {plugins}. "
            "Apache License 2.0.")


def on_config(config: Any) -> Any:
    """Write the packages' versions into the footer of every page."""
    config["copyright"] = version_footer()
    return config


def site_problems(site: Path, site_url: str | None = None) -> list[str]:
    """What would break in the built site ``site`` opened from disk (``file://``, no
    server to turn a folder into its index.html) or offline: every page's local link
    or resource must name a file of the site (not a folder), and no page may load a
    script, stylesheet or image from another host. ``404.html``, which a server sends
    for a missing path at any depth, has absolute links: they must resolve from the
    path of ``site_url`` (the server's root when unset)."""
    from urllib.parse import unquote, urlsplit

    problems: list[str] = []
    root_path = urlsplit(site_url).path if site_url else "/"
    for page in sorted(site.rglob("*.html")):
        name = page.relative_to(site).as_posix()
        html = page.read_text(encoding="utf-8", errors="replace")
        for attrs in re.findall(r"<\w+\b([^>]*)>", html):
            found = re.search(r"\s(href|src)=\"([^\"]*)\"", attrs)
            if found is None:
                continue
            attr, target = found.groups()
            if target.startswith(("#", "mailto:", "javascript:", "data:")):
                continue
            if re.match(r"[a-z]+:|//", target):
                # a link to another site is fine; loading a part of the page is not
                if attr == "src" or re.search(r"rel=\"[^\"]*(stylesheet|icon|preload)", attrs):
                    problems.append(f"{name}: loads {target} from another host")
                continue
            path = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not path:
                continue
            if path.startswith("/"):
                if name != "404.html":
                    problems.append(f"{name}: absolute link {target} (breaks from disk)")
                    continue
                if not path.startswith(root_path):
                    problems.append(f"404.html: {target} is outside the site's path {root_path}")
                    continue
                resolved = site / path[len(root_path):]
            else:
                resolved = page.parent / path
            if not resolved.is_file():
                what = "a folder" if resolved.is_dir() else "missing"
                problems.append(f"{name}: {attr}={target} is {what}")
    return problems


def on_post_build(config: Any) -> None:
    """Fail the build if the site would break opened from disk or offline."""
    problems = site_problems(Path(config["site_dir"]), config.get("site_url"))
    if problems:
        raise SystemExit("the site would break opened from disk or offline:\n  "
                         + "\n  ".join(problems[:40]))


def on_files(files: Any, config: Any) -> Any:
    """Add the benchmark's pages and plots and the rendered notebook to the site."""
    from mkdocs.structure.files import File

    for path in sorted((ROOT / "bench").rglob("*")):
        if path.suffix in (".md", ".png") and path.is_file():
            files.append(File(str(path.relative_to(ROOT)), src_dir=str(ROOT),
                              dest_dir=config["site_dir"],
                              use_directory_urls=config["use_directory_urls"]))
    if NOTEBOOK.exists():
        page, images = notebook_markdown()
        files.append(File.generated(config, "quickstart.md", content=page))
        for name, data in images.items():
            files.append(File.generated(config, name, content=data))
    return files


def drop_missing_plots(markdown: str, source: str) -> str:
    """A result page of the benchmark harness (``source``, under bench/) links the
    standard set of plots whether or not its run made them (a run of a few kinds, a
    backend's run): an image whose file is not there becomes its alt text, marked so."""
    base = (ROOT / source).parent

    def one(match: re.Match[str]) -> str:
        if (base / match.group(2)).exists():
            return match.group(0)
        return f"*({match.group(1)}: no plot in this run)*"

    return re.sub(r"!\[([^\]]*)\]\(([^)\s:]+\.png)\)", one, markdown)


def _summary(doc: str | None) -> str:
    import inspect

    """The first sentence of a docstring, its roles shown as code, for a table cell."""
    if not doc:
        return ""
    text = " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())
    text = re.sub(r":(?:py:)?[a-z]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`",
                  lambda m: f"`{m.group(1).rsplit('.', 1)[-1] if '~' in m.group(0) else m.group(1)}`",
                  text)
    text = text.replace("``", "`")
    end = re.search(r"(?<![ .][a-z])\.(\s|$)(?![a-z])", text)
    if end is not None:
        text = text[:end.start() + 1]
    return _cell(text if len(text) <= 200 else text[:197].rsplit(" ", 1)[0] + " ...")


def _kind(value: Any) -> str:
    import inspect

    if inspect.ismodule(value):
        return "module"
    if inspect.isclass(value):
        return "exception" if issubclass(value, BaseException) else "class"
    if inspect.isroutine(value):
        return "function"
    return "data"


def _counterpart(full: str, value: Any) -> str:
    """For a name with no docstring: the multiprocessing name it mirrors, if any."""
    import importlib

    module, _, name = full.rpartition(".")
    mp_module = "multiprocessing" + module[len("fiber"):]
    try:
        theirs = getattr(importlib.import_module(mp_module), name)
    except (ImportError, AttributeError):
        return ""
    if theirs is value:
        return f"the standard library's `{mp_module}.{name}` itself"
    return f"as `{mp_module}.{name}`"


def public_names(path: str) -> list[tuple[str, Any]]:
    """The public names of the module or object ``path`` with their values: a module's
    ``__all__`` (as the imported module has it), or else the classes and functions it
    defines; an object is its own one name."""
    import importlib
    import inspect
    import warnings

    try:
        module = importlib.import_module(path)
    except ImportError:
        parent, _, name = path.rpartition(".")
        return [(path, getattr(importlib.import_module(parent), name))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a deprecated name warns when read
        if hasattr(module, "__all__"):
            return [(f"{path}.{n}", getattr(module, n)) for n in module.__all__
                    if n != "__version__"]
        return [(f"{path}.{n}", v) for n, v in vars(module).items()
                if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
                and v.__module__ == path]


def names_table(markdown: str) -> str:
    """The table of every public name of the ``::: path`` blocks of an API page, each
    a link to its entry (so the strict build fails if a name has none), its kind and
    the first sentence of its docstring."""
    rows = ["| name | kind | summary |", "|---|---|---|"]
    for path in re.findall(r"^::: (\S+)", markdown, re.M):
        for full, value in public_names(path):
            kind = _kind(value)
            summary = _summary(getattr(value, "__doc__", None) if kind != "data" else None)
            rows.append(f"| [`{full}`][{full}] | {kind} | {summary or _counterpart(full, value)} |")
    return "\n".join(rows) + "\n"


def code_markdown(path: str) -> str:
    """``<!-- fiber:code PATH -->``: the repository file PATH as a collapsible block of
    code (pymdownx.details), so a page shows an example's code from its one source."""
    text = (ROOT / path).read_text(encoding="utf-8").rstrip("\n")
    body = "\n".join(("    " + line) if line else "" for line in
                     ["```python", *text.split("\n"), "```"])
    return f'??? example "{path} ({len(text.splitlines())} lines)"\n\n{body}\n'


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Expand the settings and contract tables and the includes of a page; an API
    page opens with the table of its names."""
    if page.file.src_uri.startswith("api/") and "\n::: " in markdown:
        title, _, rest = markdown.partition("\n")
        markdown = f"{title}\n\n{names_table(markdown)}\n{rest}"
    if page.file.src_uri.startswith("bench/"):
        markdown = drop_missing_plots(markdown, page.file.src_uri)
    if "<!-- fiber:settings -->" in markdown:
        markdown = markdown.replace("<!-- fiber:settings -->", settings_markdown())
    if "<!-- fiber:contract -->" in markdown:
        markdown = markdown.replace("<!-- fiber:contract -->", contract_markdown())
    markdown = re.sub(r"<!-- fiber:code (\S+) -->", lambda m: code_markdown(m.group(1)), markdown)
    markdown = re.sub(r"<!-- fiber:backend (\S+) -->",
                      lambda m: backend_markdown(m.group(1)), markdown)
    return include(markdown, page.file.src_uri)
