"""examples/quickstart.ipynb, executed by nbclient on a real Jupyter kernel (ipykernel,
this environment's Python): a Pool on the local backend in a notebook must return the
right result, show its progress display and draw the plot, and leave no process behind.

Nothing is faked: the kernel, the pool's jobs and the progress display are real. The
expected result is computed here by the notebook's own task cell, run serially (its
sleep, which only stands for work, skipped).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook test needs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the notebook test needs nbclient")
pytest.importorskip("ipykernel", reason="the notebook test needs ipykernel")
pytest.importorskip("matplotlib", reason="the notebook plots with matplotlib")

sys.path.insert(0, str(Path(__file__).parent.parent))
from procs import processes_with  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "quickstart.ipynb"


def _cell(nb: Any, needle: str) -> Any:
    found = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"one code cell with {needle!r} expected, found {len(found)}"
    return found[0]


def _stream(cell: Any, name: str) -> str:
    return "".join(o.text for o in cell.outputs
                   if o.output_type == "stream" and o.name == name)


def test_quickstart_notebook_runs_and_computes(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    token = "QUICKSTART_NB_TEST_" + secrets.token_hex(6)
    monkeypatch.setenv(token, "1")  # the kernel and every process it starts carry it
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]

    # the result: the pool's map must equal the task cell's function run serially
    namespace: dict[str, Any] = {}
    exec(_cell(nb, "def inside(").source, namespace)  # noqa: S102
    namespace["time"] = types.SimpleNamespace(sleep=lambda seconds: None)
    tasks = int(re.search(r"^TASKS = (\d+)", _cell(nb, "pool.map(").source, re.M).group(1))
    expected = sum(namespace["inside"](seed) for seed in range(tasks))
    points = namespace["POINTS"] * tasks
    map_cell = _cell(nb, "pool.map(")
    stdout = _stream(map_cell, "stdout")
    assert f"{expected} of {points} points inside: pi is about " \
           f"{4 * expected / points:.5f}" in stdout, stdout
    assert abs(4 * expected / points - math.pi) < 0.01

    # the progress display (tqdm's text bar in a kernel without widgets) reached the end
    stderr = _stream(map_cell, "stderr")
    assert f"{tasks}/{tasks}" in stderr, stderr[-2000:]

    # the plot
    plot_cell = _cell(nb, "plt.show()")
    images = [o for o in plot_cell.outputs if o.output_type == "display_data"
              and "image/png" in o.get("data", {})]
    assert len(images) == 1, json.dumps(plot_cell.outputs)[:2000]

    # the kernel is shut down; nothing it started may outlive it
    deadline = time.monotonic() + 15
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(token)
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    assert not left, f"processes left by the notebook's kernel: {left}"
