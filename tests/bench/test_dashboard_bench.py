"""``python -m bench run --kinds dashboard`` (bench/dashboard_cost.py): map throughput
with no dashboard, an idle ``fiber dashboard`` and a page open, the snapshots the
program answered in each, in the report's section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import runner

REPO = Path(__file__).resolve().parents[2]


def test_the_dashboard_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "dashboard",
         "--contenders", "fiber", "--out", str(tmp_path),
         "--results-md", str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {("dashboard", "fiber")}
    assert not data["runs"][0]["errors"], data["runs"][0]["errors"]
    got = data["summary"]["medians"]["dashboard"]["fiber"]
    for arm in ("none", "idle", "open"):
        assert got[f"tasks_per_s/{arm}"] > 0, got
    # nobody looks: the program is asked nothing; a page open: it is asked (the page
    # had its views)
    assert got["snapshots/none"] == 0 and got["snapshots/idle"] == 0, got
    assert got["page_events"] >= 1, got
    md = (tmp_path / "RESULTS.md").read_text()
    assert "## The dashboard's cost (issue #39)" in md
    assert "| `fiber dashboard` running, no page open |" in md and "met (no snapshot asked)" in md


def test_dashboard_is_opt_in():
    jobs, _, _ = runner.plan(["fiber"])
    assert "dashboard" not in jobs
    jobs, _, _ = runner.plan(["fiber"], ["dashboard"])
    assert jobs == {"dashboard": ["fiber"]}


def test_a_run_without_the_kind_shows_the_kept_rows():
    """bench/results/dashboard/latest.json (the last run of this kind alone) is what
    RESULTS.md shows when a run did not measure it, with its date and command."""
    from bench import dashboard_cost

    assert dashboard_cost.STORED.exists()
    lines = dashboard_cost.section({"summary": {"medians": {}}, "meta": {"config": {}}})
    assert lines[0] == "## The dashboard's cost (issue #39)"
    assert lines[2].startswith("Not measured in this run: these rows are from a run of "
                               "this kind alone"), lines[2]
    assert "--kinds dashboard" in lines[2]
    assert any(line.startswith("| one page open |") for line in lines)
