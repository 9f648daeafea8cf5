"""Smoke test of the benchmark harness: ``python -m bench run --smoke`` end to end.

It runs the real machinery (worker processes, every benchmark kind, the JSON, the
Markdown table, the plots) in its minimal configuration against multiprocessing
(fork and spawn), loky and fiber (when ``fiber.Pool`` exists), and checks what it
wrote. It is not a timed test: it asserts consistency, not speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fiber

pytestmark = pytest.mark.timeout(900)  # the first test also runs the whole smoke run

REPO = Path(__file__).resolve().parents[2]
CONTENDERS = ["mp-fork", "mp-spawn"]
if importlib.util.find_spec("loky") is not None:
    CONTENDERS.append("loky")
if hasattr(fiber, "Pool"):
    CONTENDERS.insert(0, "fiber")
if os.environ.get("FIBER_BENCH_SMOKE_CONTENDERS"):  # to narrow a local run, e.g. mp-fork,loky
    CONTENDERS = os.environ["FIBER_BENCH_SMOKE_CONTENDERS"].split(",")


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    out = tmp_path_factory.mktemp("bench")
    proc = _bench("run", "--smoke", "--contenders", ",".join(CONTENDERS), "--out", str(out),
                  "--results-md", str(out / "RESULTS.md"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "latest.json").read_text())
    return out, data, (out / "RESULTS.md").read_text()


def test_every_contender_ran(smoke: tuple) -> None:
    _, data, _ = smoke
    assert list(data["contenders"]) == CONTENDERS
    for name, status in data["contenders"].items():
        assert status["status"] == "ran", (name, status)
    ran = {(r["kind"], r["contender"]) for r in data["runs"]}
    for name in CONTENDERS:
        assert ("pool", name) in ran
    assert ("ipc", "memcpy") in ran
    if "fiber" in CONTENDERS:
        assert ("startup", "fiber") in ran
        assert ("shared", "fiber") in ran


def test_metadata_describes_the_run(smoke: tuple) -> None:
    _, data, md = smoke
    meta = data["meta"]
    assert meta["mode"] == "smoke"
    assert meta["machine"]["nproc"] >= 1 and meta["machine"]["memory_gib"] > 0
    assert meta["machine"]["versions"]["fiber-core"] != "not installed"
    assert meta["command"].startswith("python -m bench run --smoke")
    assert meta["command"] in md and meta["machine"]["cpu_model"] in md


def test_measurements_are_physically_possible(smoke: tuple) -> None:
    _, data, _ = smoke
    med = data["summary"]["medians"]
    cfg = data["meta"]["config"]
    for name in CONTENDERS:
        for pattern in ("map_default", "map_cs1", "rounds"):
            seconds = med["overhead"][name][f"{pattern}/10ms"]
            # The sleeps alone take the ideal time: nothing can be faster.
            assert seconds >= 0.95 * cfg["ideal"], (name, pattern, seconds)
        assert med["throughput"][name]["tasks_per_s/cs1"] > 0
        assert med["latency"][name]["median_us"] > 0
        assert med["cold_start/2"][name]["seconds"] > 0
    assert med["bandwidth"]["memcpy"]["copy/1MB"] > 0
    assert med["bandwidth"]["mp-fork"]["pipe/1MB"] > 0
    assert med["process_start"]["mp-spawn"]["median_ms"] > 0
    if "fiber" in CONTENDERS:
        startup = med["startup"]["fiber"]
        for module in ("fiber", "multiprocessing"):
            # the import happens inside the process whose whole life is timed
            assert 0 < startup[f"import_ms/{module}"] < startup[f"process_ms/{module}"]
        assert startup["process_ms/python"] > 0
        shared = med["shared"]["fiber"]
        for path in ("multiprocessing", "fiber", "fiber-creator"):
            for op in ("lock", "value_read", "value_incr", "array_slice", "event"):
                assert shared[f"us/{op}/{path}"] > 0, (op, path)
            # 4,000 increments take time, however fast each one is
            assert shared[f"ms/program/{path}"] > 0, path
        assert shared["us/pool_roundtrip/fiber"] > 0


def test_table_has_a_row_per_contender_with_ratios(smoke: tuple) -> None:
    _, data, md = smoke
    section = md.split("## 1. Framework overhead")[1].split("## 2.")[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| contender")}
    assert set(rows) == set(CONTENDERS)
    assert "(1.00x)" in rows["mp-fork"]
    med = data["summary"]["medians"]["overhead"]
    for name in CONTENDERS:
        cells = rows[name].split("|")[2:-1]
        ratio = float(re.search(r"\(([\d.]+)x\)", cells[0]).group(1))
        expect = med[name]["map_default/10ms"] / med["mp-fork"]["map_default/10ms"]
        assert ratio == pytest.approx(expect, abs=0.006), (name, cells[0])
    for heading in ("## 2. Empty-task throughput", "## 3. Round-trip latency",
                    "## 4. Cold start", "## 5. Bandwidth", "## 6. Scale",
                    "## 8. Import and start-up"):
        assert heading in md
    if "fiber" in CONTENDERS:
        section = md.split("## 8. Import and start-up")[1]
        row = next(line for line in section.splitlines() if line.startswith("| import fiber"))
        startup = data["summary"]["medians"]["startup"]["fiber"]
        ratio = float(re.search(r"\(([\d.]+)x\)", row.split("|")[2]).group(1))
        expect = startup["import_ms/fiber"] / startup["import_ms/multiprocessing"]
        assert ratio == pytest.approx(expect, abs=0.006)


def test_plots_are_written(smoke: tuple) -> None:
    out, _, _ = smoke
    for name in ("overhead", "throughput", "latency", "cold_start", "bandwidth", "scale"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_unknown_contender_is_a_clear_error() -> None:
    proc = _bench("run", "--smoke", "--contenders", "mp-fork,nosuch", timeout=120)
    assert proc.returncode != 0
    assert "unknown contender 'nosuch'" in proc.stderr
    assert "mp-fork" in proc.stderr  # the valid names are listed


def test_a_mode_is_required() -> None:
    proc = _bench("run", timeout=120)
    assert proc.returncode == 2
    assert "--quick" in proc.stderr


def test_summary_takes_medians_and_keeps_errors() -> None:
    """Pure function test on hand-written runs (no processes involved)."""
    from bench.runner import summarize

    runs = [{"contender": "a", "metrics": {"latency": {"median_us": v}}, "errors": {}}
            for v in (30.0, 10.0, 20.0)]
    runs.append({"contender": "b", "metrics": {}, "errors": {"latency": "boom"}})
    s = summarize(runs)
    assert s["medians"]["latency"]["a"] == {"median_us": 20.0, "reps": 3}
    assert s["errors"]["latency"] == {"b": "boom"}


def test_targets_are_judged_from_fiber_numbers() -> None:
    """Hand-written summary (no processes): each target is met or not met as stated."""
    from bench.report import targets

    med = {
        "overhead": {"fiber": {"map_default/1ms": 1.05, "rounds/1ms": 1.5}},
        "latency": {"fiber": {"median_us": 100.0}},
        "throughput": {"fiber": {"tasks_per_s/cs1": 900.0}, "mp-fork": {"tasks_per_s/cs1": 1000.0}},
        "cold_start/50": {"fiber": {"seconds": 0.8}},
        "bandwidth": {"fiber": {"pipe/100MB": 3.0}, "memcpy": {"copy/100MB": 10.0}},
    }
    data = {"contenders": {"fiber": {}, "mp-fork": {}}, "meta": {"config": {"ideal": 1.0}},
            "summary": {"medians": med, "errors": {}}}
    met = [m for _, _, _, m in targets(data)]
    assert met == [True, False, True, False, True, False, None, None]  # no start-up figures
    # import within 3x of multiprocessing's (29.9 <= 30), the bare process not within 2x
    med["startup"] = {"fiber": {"import_ms/fiber": 29.9, "import_ms/multiprocessing": 10.0,
                                "process_ms/fiber": 41.0, "process_ms/multiprocessing": 20.0}}
    judged = targets(data)[-2:]
    assert [m for _, _, _, m in judged] == [True, False]
    assert [v for _, v, _, _ in judged] == [29.9, 41.0]
    assert "29.9 ms vs 30 ms" in judged[0][2]
    # the baseline column holds multiprocessing's own figures to the same limits
    base = targets(data, "mp-fork")[-2:]
    assert [(v, m) for _, v, _, m in base] == [(10.0, True), (20.0, True)]


def test_backend_runs_are_summarized(smoke: tuple, tmp_path: Path) -> None:
    """Section 7 reads the runs kept under results/backends/NAME; a smoke run stands
    in for a backend run here (its numbers are real, its backend label is set)."""
    from bench import report

    _, data, _ = smoke
    run = json.loads(json.dumps(data))
    run["meta"]["fiber_backend"] = "docker"
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "latest.json").write_text(json.dumps(run))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "latest.json").write_text("{not json")
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "latest.json").write_text(json.dumps({"meta": run["meta"]}))
    runs = report.backend_runs(tmp_path)
    assert [r["meta"]["fiber_backend"] for r in runs] == ["docker"]
    # private: a unit test of the report's backend summary
    lines = report._backend_summary(runs)
    (row,) = [line for line in lines if line.startswith("| `docker`")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    if "fiber" in CONTENDERS:
        job_ms = data["summary"]["medians"]["process_start"]["fiber"]["median_ms"]
        assert cells[1] == report._fmt(job_ms)
    assert report._backend_summary([]) == []
