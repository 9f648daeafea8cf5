"""docs/troubleshooting.md covers what a user can meet: every error class fiber and its
plugins define has an entry (its id the class name in lower case), every warning and
error fiber logs is quoted there with its cause and fix, and every entry an error
names (``fiber.errors.documented``: the note ``troubleshooting:
docs/troubleshooting.md#<id>`` that a traceback prints under the message) exists.

The inventories are read from the source (every ``class ...Error`` and every
``.warning(``/``.error(`` call of fiber-core and the plugins), so an error or a warning
added later without an entry fails here. The messages are the real classes' (no fake)."""

from __future__ import annotations

import ast
import importlib
import pickle
import re
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "troubleshooting.md"
SOURCES = [*sorted((ROOT / "fiber_core" / "src" / "fiber").rglob("*.py")),
           *sorted((ROOT / "plugins").glob("*/src/*/**/*.py"))]
# format directives and the like: what varies from one message to the next
_VARYING = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrfgx%]|\{[^}]*\}")

# log calls whose text is entirely an exception's message (its class has an entry)
MESSAGE_IS_AN_ERROR = {
    "fiber/wire/gate.py": "RateLimitedLog.warning, which forwards its callers' messages "
                          "(each quoted from its own call)",
    "fiber/runtime/popen.py": "the ProcessStartError of a job that ended before it connected",
    "fiber_ssh/backend.py": "an SSH host's ClusterUnreachableError or JobCreationError",
}


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _ids(text: str) -> set[str]:
    return set(re.findall(r"\{#([a-z0-9-]+)\}", text))


def error_classes() -> dict[str, str]:
    """Every exception class defined in fiber-core and the plugins: name -> file."""
    found = {}
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and any(
                    re.search(r"(Error|Exception|Exited)$", ast.unparse(base))
                    for base in node.bases):
                found[node.name] = str(path.relative_to(ROOT))
    return found


def _text(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def log_sites() -> list[tuple[str, int, str, str | None]]:
    """Every warning and error fiber logs: (file, line, level, format string or None)."""
    sites = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            levels = []
            if isinstance(func, ast.Attribute):
                levels = [func.attr]
            elif isinstance(func, ast.IfExp):  # (logger.warning if first else logger.debug)
                levels = [f.attr for f in (func.body, func.orelse) if isinstance(f, ast.Attribute)]
            level = next((lv for lv in levels if lv in ("warning", "error")), None)
            receiver = ast.unparse(func)
            if level is None or not re.search(r"log", receiver, re.I):
                continue
            sites.append((str(path.relative_to(ROOT)), node.lineno, level, _text(node.args[0])))
    return sites


def fragment(message: str) -> str:
    """The longest part of a format string that is the same in every message."""
    return max((part.strip(" ;:,()") for part in _VARYING.split(message)), key=len)


def test_every_error_class_has_an_entry() -> None:
    classes = error_classes()
    assert len(classes) >= 20 and "ConfigError" in classes and "ForbiddenError" in classes
    ids = _ids(_page())
    missing = [f"{name} ({where})" for name, where in classes.items()
               if name.lower() not in ids]
    assert not missing, f"error classes without an entry in docs/troubleshooting.md: {missing}"


def test_every_logged_warning_and_error_is_quoted() -> None:
    page = " ".join(_page().split())
    sites = log_sites()
    assert len(sites) > 40
    missing = []
    for where, line, level, message in sites:
        if message is None or len(fragment(message)) < 6:
            if not any(where.endswith(key) for key in MESSAGE_IS_AN_ERROR):
                missing.append(f"{where}:{line} ({level}): no fixed text to look for")
            continue
        # the whole message as the page quotes it, "…" (or anything short) for each
        # varying part
        pattern = r".{0,40}?".join(re.escape(" ".join(part.split()))
                                   for part in _VARYING.split(message))
        if not re.search(pattern, page):
            missing.append(f"{where}:{line} ({level}): {message!r}")
    assert not missing, ("warnings/errors fiber logs that docs/troubleshooting.md does not "
                         f"quote: {missing}")


def deprecations() -> list[tuple[str, int, str]]:
    """Every ``warn_deprecated(spelling, message)`` call: (file, line, spelling)."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                    "warn_deprecated") and node.args:
                spelling = _text(node.args[0])
                assert spelling is not None, f"{path}:{node.lineno}"
                found.append((str(path.relative_to(ROOT)), node.lineno, spelling))
    return found


def test_every_deprecation_warning_is_listed() -> None:
    page = " ".join(_page().split("## Deprecation warnings", 1)[1].split())
    found = deprecations()
    assert len(found) >= 15
    missing = [f"{where}:{line}: {spelling!r}" for where, line, spelling in found
               if not re.search(r".{0,40}?".join(re.escape(part)
                                                for part in _VARYING.split(spelling)), page)]
    assert not missing, f"deprecated spellings the page does not list: {missing}"


def test_every_entry_an_error_names_exists() -> None:
    """The anchors the messages name (fiber.errors.documented) are entries of the page,
    and a message does name its entry."""
    from fiber import errors

    ids = _ids(_page())
    named = []
    for module_name in ("fiber.errors", "fiber.ring", "fiber.backend.secrets", "fiber.top",
                        "fiber_k8s.cluster", "fiber_ssh.hosts"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a plugin this environment does not install
            assert module_name.startswith("fiber_")
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) \
                    and hasattr(value, "troubleshooting"):
                named.append(value.troubleshooting)
    assert len(set(named)) >= 19
    assert set(named) <= ids, f"entries named by messages but absent: {set(named) - ids}"
    error = errors.ConfigError("unknown setting 'x'")
    assert str(error) == "unknown setting 'x'"  # the message itself is unchanged
    assert error.__notes__ == ["troubleshooting: docs/troubleshooting.md#configerror"]
    # a subclass without an entry of its own names its nearest one, once
    lost = errors.ClusterUnreachableError("no engine")
    assert lost.__notes__ == ["troubleshooting: docs/troubleshooting.md#clusterunreachableerror"]
    # it survives pickling (errors travel between processes) without doubling
    copy = pickle.loads(pickle.dumps(errors.ProcessStartError("m", 1, "r", "logs")))
    assert copy.__notes__ == ["troubleshooting: docs/troubleshooting.md#processstarterror"]
    # the message a Python (3.11+) traceback shows ends with the note
    shown = "".join(traceback.format_exception_only(type(error), error))
    assert shown.rstrip().endswith("troubleshooting: docs/troubleshooting.md#configerror")


def test_symptoms_come_first() -> None:
    """The page starts from what a user sees: its first section is the symptoms."""
    text = _page()
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert sections[0].startswith("By symptom")
    for symptom in ("pool-hangs-at-start", "workers-lost-every-30-s", "importerror-in-a-job",
                    "handshake-failed", "slow-start"):
        assert symptom in _ids(text)
