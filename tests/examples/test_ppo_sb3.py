"""examples/ppo_sb3.py: SB3's SubprocVecEnv runs its environments as fiber processes.

Needs torch and stable-baselines3 (examples/requirements-rl.txt); skipped without them.
"""

from __future__ import annotations

import pytest
from example_runner import run_example

import fiber

pytest.importorskip("torch", reason="needs torch==2.13.0 (examples/requirements-rl.txt)")
pytest.importorskip("stable_baselines3", reason="needs stable-baselines3 (examples/requirements-rl.txt)")
pytestmark = pytest.mark.skipif(not hasattr(fiber, "Process"), reason="fiber.Process does not exist yet")


@pytest.mark.timeout(900)
def test_ppo_trains_with_fiber_environment_processes(tmp_path) -> None:
    proc, result = run_example("ppo_sb3.py", "--envs", "2", "--timesteps", "2048",
                               "--n-steps", "256", tmp_path=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the context SB3 asks for ("forkserver") makes fiber's Process of that method
    assert result["process_types"] == ["fiber.context.ForkServerProcess"]
    assert result["job_backed"] is True
    assert result["timesteps"] >= 2048
    assert 0 < result["reward_after"] <= 500


def test_ppo_rejects_too_few_timesteps(tmp_path) -> None:
    proc, _ = run_example("ppo_sb3.py", "--envs", "2", "--timesteps", "100",
                          tmp_path=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert "timesteps must be at least" in proc.stderr
