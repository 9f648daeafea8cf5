"""The bursty-trace rows (bench/adapt.py): ``--smoke --kinds adapt`` runs the trace on
a fixed and an adaptive fiber pool (real local workers) and RESULTS.md shows both with
the two targets of issue #28 judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import adapt, runner

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_the_adaptive_pool_holds_fewer_workers_between_bursts():
    cfg = dict(runner.MODES["smoke"], adapt_period=1.5, adapt_idle_timeout=0.2)
    got = adapt.measure(cfg)
    assert set(got) == {f"{m}/{v}" for v in adapt.VARIANTS for m in (
        "worker_seconds", "makespan_s", "burst_latency_s", "most_workers", "workers_started")}
    assert got["most_workers/adaptive"] <= cfg["adapt_workers"]
    # it gave its workers back in the gap and started new ones for the second burst
    assert got["workers_started/adaptive"] > got["workers_started/fixed"]
    assert got["worker_seconds/adaptive"] < got["worker_seconds/fixed"]
    assert got["makespan_s/fixed"] >= (cfg["adapt_bursts"] - 1) * cfg["adapt_period"]


def test_only_the_adapt_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "adapt",
         "--contenders", "fiber", "--out", str(tmp_path),
         "--results-md", str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {("adapt", "fiber")}
    md = (tmp_path / "RESULTS.md").read_text()
    section = md[md.index("## 13. Adaptive pool (bursty trace)"):]
    assert "| fiber fixed |" in section and "| fiber adaptive |" in section
    assert "| worker-seconds <= 0.40x |" in section and "| makespan <= 1.20x |" in section


def test_adapt_is_opt_in():
    jobs, _, _ = runner.plan(["fiber"])
    assert "adapt" not in jobs and "faults" not in jobs
    jobs, _, _ = runner.plan(["fiber"], ["adapt"])
    assert jobs == {"adapt": ["fiber"]}


def test_a_cluster_backend_runs_the_cluster_trace_and_its_rows_are_kept(monkeypatch):
    """``--backend slurm --kinds adapt``: fiber[slurm] takes part, with bench/adapt's
    CLUSTER trace (longer tasks, further apart: a job there takes about a second to
    start); section 13 of a run that did not measure it shows each stored run's rows
    (bench/results/adapt*/latest.json), with its backend, trace and load."""
    monkeypatch.setenv("FIBER_BACKEND", "slurm")
    jobs, _, _ = runner.plan(["fiber"], ["adapt"])
    assert jobs == {"adapt": ["fiber[slurm]"]}
    cfg = runner.MODES["quick"]
    assert adapt.trace(cfg)["adapt_period"] == adapt.CLUSTER["adapt_period"] == 30.0
    assert adapt.trace(cfg, "local") is cfg
    stored = [json.loads(p.read_text())["meta"]["fiber_backend"]
              for p in adapt.stored_paths() if p.exists()]
    assert "local" in stored and "slurm" in stored, stored
    data = {"meta": {"fiber_backend": "local", "config": cfg},
            "summary": {"medians": {}, "errors": {}}}
    text = "\n".join(adapt.section(data))
    assert "| fiber[slurm] adaptive |" in text and "| fiber adaptive |" in text
    assert "bench/adapt.py on slurm: 4 bursts of 40 tasks of 250 ms" in text
    assert text.count("| worker-seconds <= 0.40x |") == 2
