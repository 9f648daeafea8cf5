"""examples/ring_allreduce.py: a torch.distributed gloo all-reduce over a fiber Ring,
run as a user runs it (the backend suite's Ring test uses a function of its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from example_runner import EXAMPLES, REPO

pytest.importorskip("torch", reason="the example needs torch (examples/requirements-rl.txt)")


def test_every_member_holds_the_sum() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "ring_allreduce.py"),
                           "--members", "3"],
                          cwd=REPO, text=True, capture_output=True, timeout=600,
                          env={**os.environ, "FIBER_HEARTBEAT_TIMEOUT": "120"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["results"] == [[6.0, 3.0]] * 3
    assert result["agree"] is True
