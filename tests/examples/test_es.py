"""examples/es.py: OpenAI-ES on CartPole with fiber.Pool must actually learn."""

from __future__ import annotations

import pytest
from example_runner import run_example

import fiber

pytest.importorskip("gymnasium", reason="examples need gymnasium (bench/requirements.txt)")
pytestmark = pytest.mark.skipif(not hasattr(fiber, "Pool"), reason="fiber.Pool does not exist yet")


def test_es_learns_cartpole(tmp_path) -> None:
    proc, history = run_example("es.py", "--workers", "2", "--iterations", "12",
                                "--population", "24", "--max-steps", "200", "--seed", "0",
                                tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rewards = [h["mean_reward"] for h in history]
    assert len(rewards) == 12
    first, last = rewards[0], sum(rewards[-3:]) / 3
    # A random linear policy balances the pole ~10-30 steps; learning must show clearly.
    assert last >= 2 * first and last >= first + 30, rewards


def test_es_is_reproducible_across_worker_counts(tmp_path) -> None:
    args = ("--iterations", "3", "--population", "8", "--max-steps", "100", "--seed", "1")
    _, one = run_example("es.py", "--workers", "1", *args, tmp_path=tmp_path)
    _, three = run_example("es.py", "--workers", "3", *args, tmp_path=tmp_path)
    assert [h["mean_reward"] for h in one] == [h["mean_reward"] for h in three]


def test_es_rejects_an_odd_population(tmp_path) -> None:
    proc, _ = run_example("es.py", "--population", "7", "--iterations", "1", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "population must be an even number" in proc.stderr
