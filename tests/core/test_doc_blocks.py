"""Every code block of README.md, docs/ and the plugins' READMEs is executed, so that no
example rots: a fenced ``python`` block runs as a script on the local backend (a
``print(...)  # text`` line must print ``text``), a ``sh`` block runs under bash.

A block that cannot run here says why in a marker, an HTML comment on the line before
its fence (invisible on the site and on GitHub):

* ``<!-- fiber:block backend NAME -->``: it needs a cluster backend; the backend's
  test environment runs it (``run_block`` below, from ``tests/<backend>/``);
* ``<!-- fiber:block fragment: WHY -->``: an excerpt (a class body, names that stand
  for the user's code): it must compile, and the test WHY names runs the real thing;
* ``<!-- fiber:block run by: WHAT -->``: another test or environment runs exactly it;
* ``<!-- fiber:block not run: WHY -->``: it cannot run in a test at all (the whole test
  suite, which contains this test);
* ``<!-- fiber:block setup: CODE -->``: runs, after ``CODE`` (one line of Python that
  defines what the block leaves to the reader).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
         *sorted((ROOT / "plugins").glob("*/README.md"))]
MARKER = re.compile(r"<!-- fiber:block (backend \w+|fragment|run by|not run|setup)"
                    r"(?::\s*(.*?))?\s*-->")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    kind: str  # "run", or the marker's kind
    detail: str

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            fence = re.match(r"^```(\w*)\s*$", lines[i])
            if fence is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            lang = fence.group(1)
            marker = MARKER.search(lines[i - 1]) if i > 0 else None
            if lang in ("python", "sh"):
                found.append(Block(str(page.relative_to(ROOT)), i + 1, lang,
                                   "\n".join(lines[i + 1:end]) + "\n",
                                   marker.group(1) if marker else "run",
                                   (marker.group(2) or "") if marker else ""))
            i = end + 1
    return found


def run_block(block: Block, env: dict[str, str] | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run a block as its reader would: a script in a fresh directory (the
    repository's root for a ``sh`` block, whose paths are the repository's)."""
    if block.lang == "python":
        setup = block.detail + "\n" if block.kind == "setup" else ""
        command = [sys.executable, "-c", setup + block.code]
        cwd = None
    else:
        command = ["bash", "-euo", "pipefail", "-c", block.code]
        cwd = ROOT
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{block.id} failed ({done.returncode}):\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    for expected in re.findall(r"print\(.*\)\s*#\s*(.+)$", block.code, re.M):
        assert expected.strip() in done.stdout, (block.id, expected, done.stdout)
    return done


ALL = blocks()


def test_every_block_runs_or_says_why() -> None:
    assert len(ALL) >= 20
    unexplained = [b.id for b in ALL if b.kind in ("fragment", "run by", "not run")
                   and len(b.detail) < 10]
    assert not unexplained, f"blocks whose marker does not say why: {unexplained}"
    # a marker must sit right before a fence of a block it can apply to
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        for n, line in enumerate(lines):
            if "fiber:block" in line:
                assert MARKER.search(line), f"{page}:{n + 1}: unknown marker {line!r}"
                assert n + 1 < len(lines) and re.match(r"```(python|sh)\s*$", lines[n + 1]), \
                    f"{page}:{n + 1}: a marker not followed by a python or sh block"


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "fragment"],
                         ids=lambda b: b.id)
def test_fragment_compiles(block: Block) -> None:
    if block.lang == "python":
        compile(block.code, block.id, "exec")
    else:
        subprocess.run(["bash", "-n", "-c", block.code], check=True)


def outputs() -> list[tuple[str, str, str]]:
    """``<!-- fiber:output COMMAND -->`` before a ``text`` block: (where, command, text)."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"<!-- fiber:output (.+?) -->\n```text\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("where,command,expected", outputs(), ids=lambda v: str(v)[:40])
def test_shown_output_is_what_the_command_prints(where: str, command: str,
                                                 expected: str) -> None:
    argv = command.split()
    argv = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "FIBER_BACKEND": "local"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == expected, (where, done.stdout)


@pytest.mark.parametrize("block", [b for b in ALL if b.kind in ("run", "setup")],
                         ids=lambda b: b.id)
def test_block_runs(block: Block) -> None:
    run_block(block, {"FIBER_BACKEND": "local"})
