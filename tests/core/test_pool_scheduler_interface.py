"""fiber.Pool talks to its pending table (fiber.runtime.pool.scheduler.Scheduler)
through a small interface of methods, never through the table's attributes.

The first test reads pool.py's source (no pool runs); the second drives the table with
no worker, as tests/core/test_pool_scheduler.py does.
"""

from __future__ import annotations

import ast
import inspect

import pytest

import fiber.pool
from fiber.runtime.pool.scheduler import Scheduler

# the interface, as docs/architecture.md's pool section lists it
INTERFACE = {"size", "max_attempts", "pool_state", "failure", "processes", "check_running",
             "submit_call", "submit_chunks", "feed_started", "feed_ended", "close"}


def _uses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, name, whether it is called) of every ``<...>._scheduler.name`` and
    ``scheduler.name`` in ``tree``."""
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    uses = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and owner.attr == "_scheduler") or (
                isinstance(owner, ast.Name) and owner.id == "scheduler"):
            uses.append((node.lineno, node.attr, id(node) in calls))
    return uses


def test_pool_uses_only_the_scheduler_s_interface():
    uses = _uses(ast.parse(inspect.getsource(fiber.pool)))
    assert uses  # the check sees pool.py's calls
    wrong = [(line, name) for line, name, called in uses
             if not called or name not in INTERFACE]
    assert wrong == [], f"pool.py reaches into the scheduler at (line, name) {wrong}"
    for name in INTERFACE:
        assert callable(getattr(Scheduler, name)), name


def test_the_interface_answers():
    s = Scheduler(3, 2)
    assert (s.size(), s.max_attempts(), s.pool_state(), s.failure(), s.processes()) \
        == (3, 2, "RUN", None, [])
    s.feed_started()  # a feeder reading: the closed pool has work unfinished
    s.close()
    assert s.pool_state() == "CLOSE" and s.unfinished()
    s.feed_ended()
    assert not s.unfinished()
    with pytest.raises(ValueError, match="Pool not running"):
        s.feed_started()
