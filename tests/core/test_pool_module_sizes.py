"""Issue #27: the pool's modules have one job each, none over 500 lines (a module over
it must be one class with one job and say why in its docstring). Reads the sources.
"""

from __future__ import annotations

from pathlib import Path

import fiber.pool
import fiber.runtime.pool

LIMIT = 500
# modules allowed over the limit: one class with one job, saying why ("one job")
ONE_CLASS = {"scheduler.py"}


def _modules() -> list[Path]:
    return [Path(fiber.pool.__file__),
            *sorted(Path(fiber.runtime.pool.__file__).parent.glob("*.py"))]


def test_no_pool_module_over_the_limit():
    over = {p.name: n for p in _modules()
            if (n := len(p.read_text().splitlines())) > LIMIT and p.name not in ONE_CLASS}
    assert over == {}


def test_a_module_over_the_limit_says_why():
    for p in _modules():
        text = p.read_text()
        if len(text.splitlines()) > LIMIT:
            head = text.split('"""')[1]
            assert "one job" in head, f"{p.name} is over {LIMIT} lines and says not why"
