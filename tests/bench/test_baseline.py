"""``python -m bench run --baseline REV``: fiber of another commit as a contender.

The smoke run is real: a detached worktree of the baseline commit (in a cache directory
of the test's own, removed afterwards), benchmark processes and pools of both fibers.
The test checks that ``fiber@REV``'s processes, the harness's and a pool worker's,
import fiber from the baseline tree and ``fiber``'s from this checkout, and that the
report compares the two. The verdict tests feed :mod:`bench.compare` made-up
repetitions (no run): they check its arithmetic, not a measurement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import compare

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[2]
# The last commit before the work of issues #27 and #29: its local backend's entry
# point is a module (the installed metadata, this checkout's, names `...:plugin`).
REV = "378bcfd"


def _has_rev() -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{REV}^{{commit}}"], cwd=REPO,
                          capture_output=True).returncode == 0


def _bench(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=500, env=env)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("baseline-cache")
    env = dict(os.environ, BENCH_BASELINE_CACHE=str(root))
    yield root, env
    for tree in root.iterdir():  # the worktrees made: unregistered from the repository
        if (tree / ".git").exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                           capture_output=True)


@pytest.fixture(scope="module")
def smoke(cache, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    if not _has_rev():
        pytest.skip(f"commit {REV} is not in this clone's history (a shallow clone)")
    root, env = cache
    out = tmp_path_factory.mktemp("bench")
    proc = _bench(env, "run", "--smoke", "--baseline", REV, "--contenders", "fiber,mp-fork",
                  "--kinds", "pool", "--out", str(out), "--results-md",
                  str(out / "RESULTS.md"), "--no-plots")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "latest.json").read_text())
    return root, data, (out / "RESULTS.md").read_text()


def test_the_baseline_is_a_contender_that_runs_the_old_tree(smoke: tuple) -> None:
    root, data, _ = smoke
    name = f"fiber@{REV}"
    assert list(data["contenders"]) == ["fiber", name, "mp-fork"]
    assert data["contenders"][name]["status"] == "ran", data["contenders"][name]
    tree = (root / REV).resolve()
    assert (tree / "fiber_core" / "src" / "fiber").is_dir()
    assert not tree.is_relative_to(REPO.resolve())
    files = {r["contender"]: r.get("fiber_file") for r in data["runs"] if r["kind"] == "pool"}
    for where in ("harness", "worker"):
        old = Path(files[name][where]).resolve()
        new = Path(files["fiber"][where]).resolve()
        assert old.is_relative_to(tree / "fiber_core" / "src"), (where, old)
        assert not new.is_relative_to(tree), (where, new)
    for bench in ("latency", "throughput", "overhead"):
        assert data["summary"]["medians"][bench][name], bench


def test_the_report_compares_fiber_with_the_baseline(smoke: tuple) -> None:
    _, data, md = smoke
    name = f"fiber@{REV}"
    assert f"## fiber against {name}, same run" in md
    rows = compare.rows(data)
    got = {(r["bench"], r["metric"]) for r in rows}
    assert ("latency", "median_us") in got and ("throughput", "tasks_per_s/cs1") in got
    for r in rows:
        assert r["ratio"] == pytest.approx(r["new"] / r["old"])
    lat = next(r for r in rows if r["metric"] == "median_us")
    assert "| latency | median_us | lower |" in md
    assert f"{lat['ratio']:.2f}" in md


def test_a_second_run_reuses_the_tree(cache, smoke: tuple) -> None:
    root, env = cache
    marker = root / REV / "fiber_core" / "src" / "fiber" / "_kept"
    marker.write_text("")
    proc = _bench(env, "run", "--smoke", "--baseline", REV, "--contenders", "mp-fork",
                  "--kinds", "startup", "--out", str(root / "out2"), "--results-md",
                  str(root / "out2" / "RESULTS.md"), "--no-plots")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.exists()
    assert "reusing" in proc.stderr


def test_an_unknown_revision_is_a_clear_error(cache) -> None:
    _, env = cache
    proc = _bench(env, "run", "--smoke", "--baseline", "no-such-rev-0", "--kinds", "pool")
    assert proc.returncode != 0
    assert "--baseline 'no-such-rev-0': not a commit" in proc.stderr


def test_a_cluster_backend_is_refused(cache) -> None:
    _, env = cache
    proc = _bench(dict(env, FIBER_BACKEND="docker"), "run", "--smoke", "--baseline", "HEAD")
    assert proc.returncode != 0
    assert "--baseline runs on the local backend only" in proc.stderr


def _data(new: list[float], old: list[float], metric: str = "median_us") -> dict:
    runs = [{"contender": c, "kind": "pool", "metrics": {"latency": {metric: v}}}
            for c, vs in (("fiber", new), ("fiber@abc1234", old)) for v in vs]
    med = {c: {metric: sorted(vs)[len(vs) // 2]}
           for c, vs in (("fiber", new), ("fiber@abc1234", old))}
    return {"contenders": {"fiber": {}, "fiber@abc1234": {}}, "runs": runs,
            "summary": {"medians": {"latency": med}}}


@pytest.mark.parametrize(("new", "old", "metric", "verdict"), [
    ([130, 140, 150], [100, 105, 110], "median_us", "**worse**"),  # apart, 33% slower
    ([100, 140, 150], [100, 105, 141], "median_us", "same"),  # the repetitions overlap
    ([80, 85, 90], [100, 105, 110], "median_us", "better"),
    ([800, 850, 900], [1000, 1050, 1100], "tasks_per_s/cs1", "**worse**"),  # fewer tasks/s
    ([150], [100], "median_us", "worse?"),  # once each: cannot tell noise
    ([104, 105, 106], [100, 100, 100], "median_us", "same"),  # apart, within the margin
])
def test_verdicts(new: list[float], old: list[float], metric: str, verdict: str) -> None:
    (row,) = compare.rows(_data(new, old, metric))
    assert row["verdict"] == verdict
    assert row["ratio"] == pytest.approx(row["new"] / row["old"])


@pytest.mark.parametrize("bytecode", [True, False])
def test_both_fibers_import_under_the_same_bytecode_conditions(tmp_path: Path,
                                                               bytecode: bool) -> None:
    """With byte code written, both trees are compiled before the run; without
    (PYTHONDONTWRITEBYTECODE), the baseline's cached byte code is removed: an old tree
    with byte code against a checkout without made `import fiber` look 2x slower."""
    old, new = tmp_path / "old", tmp_path / "new"
    for src in (old, new):
        (src / "pkg").mkdir(parents=True)
        (src / "pkg" / "__init__.py").write_text("X = 1\n")
    (old / "pkg" / "__pycache__").mkdir()
    (old / "pkg" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"stale")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    code = f"from bench import baseline; baseline.same_bytecode([{str(old)!r}], [{str(new)!r}])"
    subprocess.run([sys.executable, *([] if bytecode else ["-B"]), "-c", code], cwd=REPO,
                   env=env, check=True, timeout=60)
    caches = {src.name: list((src / "pkg").glob("__pycache__/*.pyc")) for src in (old, new)}
    if bytecode:
        assert caches["old"] and caches["new"]
    else:
        assert not caches["old"] and not caches["new"]


def test_the_pool_machinery_is_imported_before_a_cold_start_is_timed() -> None:
    """A cold start excludes importing the framework (bench/worker.py). Since #27
    `fiber.Pool` imports no pool machinery, and the import (about 110 ms) landed in
    fiber's timed cold start of 5 workers, 1.4x that of fiber@378bcfd."""
    code = ("import sys; from bench import worker; worker._import_framework('fiber'); "
            "print('fiber.pool' in sys.modules, 'pynng' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.split() == ["True", "True"]
