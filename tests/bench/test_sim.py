"""The simulated-workers rows (bench/sim.py): a real master (``fiber.Pool``) whose jobs
are simulated pool workers speaking the real wire protocol (bench/simulator.py, through
the bench backend ``sim``: the jobs are the faked layer, the master is fiber's own).
At a tiny scale: the numbers come out, every task's result arrives once, and nothing
is left running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import runner, sim

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_a_real_master_drives_a_map_through_simulated_workers():
    cfg = dict(runner.MODES["smoke"])
    got = sim.run_size(50, cfg)
    tasks = cfg["sim_tasks_min"]
    assert got["workers"] == 50 and got["conns_per_worker"] == 2
    assert got["tasks"] == tasks
    # the master checked map's result against range(tasks) (every result, in order);
    # the simulators sent each task's result once, and the pool counted each once
    assert got["results_sent"] == tasks
    assert got["pool_done"] == tasks
    assert got["batches"] >= 1
    for key in ("tasks_per_s", "cpu_us_per_task", "kb_per_worker", "connect_s",
                "idle_cpu_pct", "polls_per_s", "results_per_msg"):
        assert got[key] > 0, key
    assert got["simulators_left"] == 0


def test_only_the_sim_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "sim",
         "--contenders", "fiber", "--out", str(tmp_path),
         "--results-md", str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {("sim", "fiber")}
    assert data["summary"]["medians"]["sim"]["fiber"]["tasks_per_s/50"] > 0
    md = (tmp_path / "RESULTS.md").read_text()
    section = md[md.index("## 14. The master at thousands of workers"):]
    assert "| 50 | 2 | 50 (0) |" in section
    assert ">= 20,000 tasks/s at 50 workers" in section


def test_sim_is_opt_in():
    jobs, _, _ = runner.plan(["fiber"])
    assert "sim" not in jobs
    jobs, _, _ = runner.plan(["fiber"], ["sim"])
    assert jobs == {"sim": ["fiber"]}
