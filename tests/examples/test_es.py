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


def test_es_plot_draws_each_run_from_its_own_start(tmp_path) -> None:
    """--plot trains per worker count, then writes the two-panel plot and exits 0."""
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (examples/requirements.txt)")
    png = tmp_path / "es.png"
    proc, runs = run_example("es.py", "--plot", "--plot-workers", "1,2", "--iterations", "3",
                             "--population", "8", "--max-steps", "100", "--threshold", "15",
                             "--plot-out", str(png), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert png.stat().st_size > 10_000 and f"wrote {png}" in proc.stdout
    assert sorted(runs) == ["1", "2"]
    for history in runs.values():
        assert len(history) == 3
        # each run's clock starts once its own workers are up: the first iteration is
        # measured from there, and the start-up apart
        assert 0 < history[0]["seconds"] < history[-1]["seconds"] + 1e-9
        assert history[0]["startup_seconds"] > 0
        assert history[0]["seconds"] < history[0]["startup_seconds"] + 5
    assert [h["mean_reward"] for h in runs["1"]] == [h["mean_reward"] for h in runs["2"]]


def test_es_plot_without_matplotlib_says_so_before_training(tmp_path) -> None:
    """matplotlib is hidden (``sys.modules['matplotlib'] = None``, as if not installed)."""
    import subprocess
    import sys

    from example_runner import EXAMPLES, REPO

    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = [{str(EXAMPLES / 'es.py')!r}, '--plot', '--iterations', '1']; "
            f"runpy.run_path({str(EXAMPLES / 'es.py')!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1
    assert "pip install -r examples/requirements.txt" in proc.stderr
    assert "iter" not in proc.stdout  # nothing was trained first


def test_es_on_an_adaptive_pool_learns_the_same(tmp_path) -> None:
    """``--adapt 0``: the pool gives back a worker as soon as it is idle (between
    iterations) and starts workers for the next population; the rewards are those of
    a fixed pool with the same seed."""
    args = ("--workers", "2", "--iterations", "3", "--population", "8", "--max-steps",
            "100", "--seed", "1")
    proc, adaptive = run_example("es.py", *args, "--adapt", "0", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "adaptive pool: 0 to 2 workers, idle timeout 0 s" in proc.stdout, proc.stdout
    _, fixed = run_example("es.py", *args, tmp_path=tmp_path)
    assert [h["mean_reward"] for h in adaptive] == [h["mean_reward"] for h in fixed]
    assert all(h["workers_started"] >= 2 for h in adaptive), adaptive
