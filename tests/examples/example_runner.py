"""Helpers for running the example scripts as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def run_example(script: str, *args: str, tmp_path: Path, timeout: float = 600) -> tuple:
    """Run ``examples/<script>`` with ``--json``; returns (process, parsed JSON or None)."""
    out = tmp_path / f"{script}.json"
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args, "--json", str(out)],
                          cwd=REPO, text=True, capture_output=True, timeout=timeout)
    data = json.loads(out.read_text()) if out.exists() else None
    return proc, data
