"""The explicit-chunksize rows (bench/chunks.py): ``--smoke --kinds chunks`` measures
map and imap for fiber, mp-fork and mp-spawn, each in its own process, and RESULTS.md
shows them with fiber's ratio to each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import chunks, runner

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]


def test_measure_checks_and_times_every_call():
    got = chunks.measure("fiber", 500, [1, 7])
    assert set(got) == {f"s/{m}/cs={cs}" for m in chunks.METHODS for cs in (1, 7)}
    assert all(0 < v < 60 for v in got.values())


def test_only_the_chunk_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "chunks",
         "--contenders", "fiber,mp-fork,mp-spawn", "--out", str(tmp_path),
         "--results-md", str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {
        ("chunks", name) for name in chunks.CONTENDERS}
    medians = data["summary"]["medians"]["chunks"]
    sizes = runner.MODES["smoke"]["chunks_sizes"]
    for name in chunks.CONTENDERS:
        assert set(medians[name]) == {f"s/{m}/cs={cs}" for m in chunks.METHODS
                                      for cs in sizes} | {"reps"}
    md = (tmp_path / "RESULTS.md").read_text()
    section = md[md.index("## 12. Explicit chunk sizes"):]
    rows = [line for line in section.splitlines() if line.startswith("| map |")
            or line.startswith("| imap |")]
    assert len(rows) == 2 * len(sizes)
    assert all(line.count("|") == 9 and " - |" not in line for line in rows)
