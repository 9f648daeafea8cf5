"""``kill()`` and ``terminate()`` of a process whose job has not connected yet give
multiprocessing's exit codes, -9 and -15, whatever signal the cluster ended the job
with: Slurm cancels a job whose batch step has not launched with a plain SIGTERM, so
a ``kill()`` at that moment reported -15 (the shipped suite's
``test_kill_gives_minus_nine`` failed so on the slurm backend of a loaded CI run).

The cluster's way of cancelling is injected by the ``faulty`` test backend of
``tests/fault_plugin`` (``FAULTY_CANCEL_PLAIN=1``: the real local backend, whose
``terminate`` then always sends SIGTERM); the job is held from connecting by a
``python`` setting that is a real shell script sleeping before it starts Python.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

FAULT_PLUGIN = Path(__file__).parent.parent / "fault_plugin"

SCRIPT = """
import time
import fiber

def nap():
    time.sleep(60)

if __name__ == "__main__":
    for end in ("kill", "terminate"):
        p = fiber.Process(target=nap)
        p.start()
        getattr(p, end)()  # its job is still in the slow interpreter's sleep
        p.join(30)
        print(end, p.exitcode, flush=True)
"""


def test_an_unconnected_job_ended_gives_the_signal_asked_for(run_script, tmp_path):
    slow = tmp_path / "slow-python"
    slow.write_text(f"#!/bin/sh\nsleep 5\nexec {sys.executable} \"$@\"\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(FAULT_PLUGIN),
                                                     os.environ.get("PYTHONPATH")) if p),
           "FIBER_BACKEND": "faulty", "FAULTY_CANCEL_PLAIN": "1", "FIBER_PYTHON": str(slow)}
    result = run_script(SCRIPT, env=env, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["kill -9", "terminate -15"], \
        result.stdout + result.stderr
