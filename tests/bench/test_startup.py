"""The import and start-up rows: `python -X importtime` output parsed for the top-level
module only, real measurements in fresh interpreters, and ``--kinds startup`` running
just these rows and judging their two targets in RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import runner, startup

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]

IMPORTTIME = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |   _io
import time:       300 |        900 |     fiber.errors
import time:       400 |       1300 |   fiber
import time:       250 |       2600 | fiber
import time:        80 |         80 |   json.decoder
import time:       700 |        780 | json
"""


def test_importtime_is_read_for_the_top_level_module_only():
    assert startup.parse_importtime(IMPORTTIME, "fiber") == 2.6  # not the nested line
    assert startup.parse_importtime(IMPORTTIME, "json") == 0.78
    with pytest.raises(ValueError, match="did not report importing 'fiber.errors'"):
        startup.parse_importtime(IMPORTTIME, "fiber.errors")  # nested only
    with pytest.raises(ValueError, match="'numpy'"):
        startup.parse_importtime(IMPORTTIME, "numpy")


def test_measured_in_fresh_interpreters():
    got = startup.measure(2)
    assert set(got) == {"import_ms/fiber", "import_ms/multiprocessing", "process_ms/fiber",
                        "process_ms/multiprocessing", "process_ms/python"}
    for module in startup.MODULES:
        assert 0 < got[f"import_ms/{module}"] < got[f"process_ms/{module}"]


def test_a_failing_import_is_an_error_not_a_number():
    with pytest.raises(RuntimeError, match="no_such_module_here"):
        startup.import_ms("no_such_module_here")


def test_only_the_startup_rows(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--smoke", "--kinds", "startup",
         "--contenders", "fiber,mp-fork", "--out", str(tmp_path), "--results-md",
         str(tmp_path / "RESULTS.md"), "--no-plots"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "latest.json").read_text())
    assert {(r["kind"], r["contender"]) for r in data["runs"]} == {("startup", "fiber")}
    assert data["contenders"]["fiber"]["status"] == "ran"
    assert data["contenders"]["mp-fork"]["status"] == "skipped"
    med = data["summary"]["medians"]["startup"]["fiber"]
    md = (tmp_path / "RESULTS.md").read_text()
    for text, metric, factor in (("`import fiber` within 3x", "import_ms", 3),
                                 ("only imports fiber exits within 2x", "process_ms", 2)):
        row = next(line for line in md.splitlines() if text in line)
        met = med[f"{metric}/fiber"] <= factor * med[f"{metric}/multiprocessing"]
        assert row.split("|")[3].strip() == ("met" if met else "**not met**"), row


def test_an_unknown_kind_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--smoke", "--kinds",
                           "startup,nosuch"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0
    assert "nosuch" in proc.stderr and "startup" in proc.stderr


def test_every_mode_measures_the_startup_rows():
    for mode in runner.MODES.values():
        assert mode["startup_samples"] >= 3
    jobs, _, _ = runner.plan(["fiber", "mp-fork"])
    assert jobs["startup"] == ["fiber"]
    assert runner.plan(["mp-fork"])[0]["startup"] == []  # fiber not asked for
