"""examples/rl_async_manager.py: remote environments through fiber's AsyncManager."""

from __future__ import annotations

import importlib.util

import pytest
from example_runner import run_example


def _has_async_manager() -> bool:
    if importlib.util.find_spec("fiber.managers") is None:
        return False
    import fiber.managers

    return hasattr(fiber.managers, "AsyncManager")


pytest.importorskip("gymnasium", reason="examples need gymnasium (bench/requirements.txt)")
pytestmark = pytest.mark.skipif(not _has_async_manager(),
                                reason="fiber.managers.AsyncManager does not exist yet")


def test_remote_environments_match_the_serial_loop_and_run_in_parallel(tmp_path) -> None:
    proc, result = run_example("rl_async_manager.py", "--envs", "4", "--steps", "30",
                               "--step-ms", "20", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert result["same_transitions"] is True
    # 4 environments waiting 20 ms per step: serial needs >= 4*31*20 ms; in parallel the
    # waits overlap.
    assert result["serial_seconds"] >= 4 * 31 * 0.020
    assert result["speedup"] > 1.5, result


def test_bad_arguments_are_rejected(tmp_path) -> None:
    proc, _ = run_example("rl_async_manager.py", "--envs", "0", tmp_path=tmp_path)
    assert proc.returncode == 2
    assert "--envs and --steps must be >= 1" in proc.stderr
