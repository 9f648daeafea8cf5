"""``python -m bench es``: the ES demo's comparison from the benchmark suite writes
es.png and es.json (every run's records) into its output directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("gymnasium", reason="the ES demo needs examples/requirements.txt")
pytest.importorskip("matplotlib", reason="the ES demo needs examples/requirements.txt")


def test_bench_es_writes_the_plot_and_the_runs(tmp_path):
    from conftest import REPO

    out = subprocess.run([sys.executable, "-m", "bench", "es", "--workers", "1,2",
                          "--iterations", "2", "--population", "4", "--max-steps", "50",
                          "--threshold", "10", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "es.png").stat().st_size > 10_000
    runs = json.loads((tmp_path / "es.json").read_text())
    assert sorted(runs) == ["1", "2"] and all(len(h) == 2 for h in runs.values())
