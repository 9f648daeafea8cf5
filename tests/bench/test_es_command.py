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


def test_bench_es_runs_16_workers_on_the_ssh_test_engine(tmp_path):
    """The demo on a cluster backend, as the benchmark suite runs it: 16 workers as
    jobs on the SSH test hosts (network namespaces the engine script starts and stops),
    a short training whose every run is recorded."""
    pytest.importorskip("fiber_ssh", reason="the ssh run needs plugins/fiber-ssh")
    from conftest import REPO

    out = subprocess.run([sys.executable, "-m", "bench", "es", "--backend", "ssh",
                          "--workers", "16", "--iterations", "3", "--population", "16",
                          "--max-steps", "50", "--threshold", "10", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = json.loads((tmp_path / "es.json").read_text())
    assert sorted(runs) == ["16"] and len(runs["16"]) == 3
    assert (tmp_path / "es.png").stat().st_size > 10_000
