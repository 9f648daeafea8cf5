"""``python -m bench run --kinds durable`` (bench/durable.py): a durable pool's
throughput against a plain one's, and a re-run answered from its journal, in the
report's section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import runner

REPO = Path(__file__).resolve().parents[2]


def test_the_durable_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "durable",
         "--contenders", "fiber", "--out", str(tmp_path),
         "--results-md", str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {("durable", "fiber")}
    assert not data["runs"][0]["errors"], data["runs"][0]["errors"]
    got = data["summary"]["medians"]["durable"]["fiber"]
    assert got["tasks_per_s/plain"] > 0 and got["tasks_per_s/durable"] > 0
    assert got["replay_seconds"] > 0 and got["journal_bytes"] > 0
    md = (tmp_path / "RESULTS.md").read_text()
    assert "## Durable pools (issue #40)" in md
    assert "re-run answered from the journal, 2,000 results" in md


def test_durable_is_opt_in():
    jobs, _, _ = runner.plan(["fiber"])
    assert "durable" not in jobs
    jobs, _, _ = runner.plan(["fiber"], ["durable"])
    assert jobs == {"durable": ["fiber"]}
