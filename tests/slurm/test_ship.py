"""A program shipped to Slurm jobs whose interpreter has nothing of fiber (issue #38).

The test cluster's node is this machine (one slurmd), so it sees the same files; what
makes its jobs bare is their interpreter: Debian's ``/usr/bin/python3.11`` (the
``python`` setting), for which nothing is installed (the test proves it with a job of
its own, ``srun``), run with ``-I`` (the launcher's ``PYTHONPATH``, which Slurm's
``--export=ALL`` passes on, does not reach it). The program of tests/ship_program.py
(a module next to its main script, a dependency from a wheel built here) runs with
``ship`` on: correct results, every task run by that interpreter from the cache, each
archive sent once (one node); a second run sends nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BARE = "/usr/bin/python{}.{}".format(*sys.version_info[:2])


def test_a_program_runs_on_a_node_from_a_bare_python(slurm_cluster, tmp_path):
    from ship_program import MAIN, make_wheel

    if not os.path.exists(BARE):
        pytest.skip(f"{BARE} is missing")
    proof = subprocess.run(["srun", "--partition", os.environ.get("FIBER_SLURM_PARTITION",
                                                                   "fiber"),
                            BARE, "-I", "-c", "import fiber"],
                           capture_output=True, text=True, timeout=120)
    assert proof.returncode != 0 and "No module named 'fiber'" in proof.stderr, proof
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), str(make_wheel(tmp_path))], check=True)
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "mylib.py").write_text("def step(x):\n    return x + 1\n")
    cache = tmp_path / "cache"
    settings = {"ship": ["pkg:shipdep"], "python": BARE, "ship_cache": str(cache)}
    env = {**os.environ, "FIBER_BACKEND": "slurm", "PYTHONPATH": str(site),
           "TMPDIR": str(tmp_path),
           "SHIP_TEST_SETTINGS": json.dumps(settings), "SHIP_TEST_WORKERS": "2",
           "SHIP_TEST_WAIT": "1"}

    def run() -> dict:
        done = subprocess.run([sys.executable, "main.py"], cwd=project, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first.get("results") == [x * 10 + 1 for x in range(8)], json.dumps(first)
    for seen in first["where"]:
        assert seen["python"] == BARE
        for name in ("fiber", "mylib", "shipdep"):
            assert seen[name].startswith(str(cache) + "/"), seen
    assert sorted(first["sent"].values()) == [1, 1], first["sent"]
    second = run()
    assert second.get("results") == first["results"], json.dumps(second)
    assert second["sent"] == {}
    assert not [p for p in Path(cache).iterdir() if ".partial-" in p.name]
