"""The quick mode's shortcuts keep every benchmark kind: the cold start of the pool
the other benchmarks use (``cold_from_session``), the big cold start in the first
repetitions only (``big_cold_reps``), and smaller sizes; run for real through
``python -m bench.worker`` against multiprocessing (fork)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import contenders, runner

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_quick_mode_keeps_every_kind_and_contender():
    quick, full = runner.MODES["quick"], runner.MODES["full"]
    assert set(full) <= set(quick)
    assert quick["workers"] in quick["cold_sizes"] and 50 in quick["cold_sizes"]
    assert 0.001 in quick["durations"] and 100 in quick["bw_sizes"]
    assert quick["scale_sizes"] and quick["reps"] >= 3 and quick["big_cold_reps"] >= 1
    assert "cold_from_session" not in full and "big_cold_reps" not in full
    names = [c.name for c in contenders.by_name(None)]
    jobs, status, _ = runner.plan(None)
    assert set(status) == set(names)  # every contender is planned (or noted as missing)


def _worker(tmp_path: Path, cfg: dict) -> dict:
    out = tmp_path / "result.json"
    spec = json.dumps({"kind": "pool", "contender": "mp-fork", "config": cfg})
    proc = subprocess.run([sys.executable, "-m", "bench.worker", spec, str(out)], cwd=REPO,
                          # private: the environment bench's runner gives its runs
                          env=runner._env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _config(rep: int) -> dict:
    return dict(runner.MODES["smoke"], workers=2, cold_sizes=[2, 3], big_cold_reps=1,
                cold_from_session=True, rep=rep)


def test_cold_start_measured_on_the_benchmarked_pool(tmp_path):
    result = _worker(tmp_path, _config(rep=0))
    metrics = result["metrics"]
    assert not result["errors"], result["errors"]
    cold = metrics["cold_start/2"]
    assert 0 < cold["seconds"] and cold["close_seconds"] >= 0 and cold["rounds"] >= 1
    assert metrics["latency"]["median_us"] > 0 and metrics["overhead"]
    assert metrics["cold_start/3"]["seconds"] > 0  # a bigger pool: started on its own


def test_big_cold_start_only_in_the_first_repetitions(tmp_path):
    result = _worker(tmp_path, _config(rep=1))
    assert "cold_start/2" in result["metrics"] and "cold_start/3" not in result["metrics"]
    assert "cold_start/3" not in result["errors"]  # left out, not an error


def test_a_cold_start_that_times_out_is_a_result_not_a_broken_contender(tmp_path):
    result = _worker(tmp_path, dict(_config(rep=0), cold_timeout=0))
    assert "TimeoutError" in result["errors"]["cold_start/2"]
    assert "start" not in result["errors"]  # the other benchmarks ran on a new pool
    assert result["metrics"]["latency"]["median_us"] > 0
