"""fiber.Pool, the imap feeder and the adapt driver talk to the pending table
(fiber.runtime.pool.scheduler.Scheduler) through small interfaces of methods, never
through the table's attributes.

The source tests read pool.py's, feeder.py's and adapt.py's source (no pool runs); the
others drive the table with no worker, as tests/core/test_pool_scheduler.py does.
"""

from __future__ import annotations

import ast
import inspect

import pytest

import fiber.pool
import fiber.runtime.pool.adapt
import fiber.runtime.pool.feeder
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import Worker

# the interface, as docs/architecture.md's pool section lists it
INTERFACE = {"size", "max_attempts", "pool_state", "failure", "processes", "check_running",
             "submit_call", "submit_chunks", "feed_started", "feed_ended", "close"}
# what the imap feeder and the adapt driver use (scheduler.py lists them)
FEEDER_INTERFACE = {"pool_state", "size", "submit_chunks", "feed_ended"}
ADAPT_INTERFACE = {"pool_state", "failure", "size", "unfinished", "set_size",
                   "set_adaptive", "alive_workers", "queued", "task_time"}


def _is_scheduler(node: ast.AST, aliases: set[str]) -> bool:
    """Whether ``node`` is ``<...>._scheduler``, ``scheduler`` or a local alias of one."""
    return (isinstance(node, ast.Attribute) and node.attr == "_scheduler") or (
        isinstance(node, ast.Name) and (node.id == "scheduler" or node.id in aliases))


def _uses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, name, whether it is called) of every ``<...>._scheduler.name`` and
    ``scheduler.name`` in ``tree``, and of ``s.name`` where ``s = self._scheduler``."""
    aliases = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and _is_scheduler(n.value, set()) for t in n.targets
               if isinstance(t, ast.Name)}
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_scheduler(node.value, aliases):
            uses.append((node.lineno, node.attr, id(node) in calls))
    return uses


def _check(module: object, interface: set[str], *, at_least: set[str]) -> None:
    uses = _uses(ast.parse(inspect.getsource(module)))  # type: ignore[arg-type]
    # the check sees the module's calls (an alias it missed would hide them)
    assert at_least <= {name for _, name, _ in uses}
    wrong = [(line, name) for line, name, called in uses
             if not called or name not in interface]
    assert wrong == [], f"{module.__name__} reaches into the scheduler at (line, name) " \
        f"{wrong}"  # type: ignore[attr-defined]
    for name in interface:
        assert callable(getattr(Scheduler, name)), name


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


def test_feeder_uses_only_the_scheduler_s_interface():
    _check(fiber.runtime.pool.feeder, FEEDER_INTERFACE, at_least={"submit_chunks"})


def test_adapt_driver_uses_only_the_scheduler_s_interface():
    _check(fiber.runtime.pool.adapt, ADAPT_INTERFACE, at_least={"unfinished"})


def test_the_feeder_and_adapt_interface_answers():
    s = Scheduler(2, 1)
    assert (s.queued(), s.task_time(), list(s.alive_workers())) == (0, None, [])
    s.submit_call(len, ((),), {}, None)
    assert s.queued() == 1
    w, = s.new_workers(1)
    assert list(s.alive_workers()) == [w] and isinstance(w, Worker)
    s.set_size(5)
    assert s.size() == 5
    # adapting: a worker lost lowers the target (Scheduler.lose); not adapting, it stays
    s.set_adaptive(True)
    s.lose(w)
    assert s.size() == 4
    s.set_adaptive(False)
    w2, = s.new_workers(1)
    s.lose(w2)
    assert s.size() == 4
