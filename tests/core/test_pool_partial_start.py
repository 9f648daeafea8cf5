"""A pool whose workers fail to start part way: the first worker's job is created, the
next ones' creation is refused while the first worker runs the map's tasks. The map
must raise the backend's error within seconds (the tasks the first worker held fail
too) and the pool end the worker it did start, leaving no process behind.

The refusal is injected by the ``faulty`` test backend of ``tests/fault_plugin``
(``FAULTY_CREATE_PERMANENT_AFTER=1``: the real local backend creates the first job,
then ``create_job`` raises ``JobCreationError``; ``FAULTY_REFUSE_WHEN``: only once the
first worker runs a task of the map, which creates that file). The refusal used to
come 2 s after the first job's creation (``FAULTY_START_DELAY=2``): on a loaded
machine the first worker was not up by then, the pool broke and ended it before it
ran anything ("started 0", issue #44). The worker that starts is a real job.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))
from procs import processes_with  # noqa: E402

FAULT_PLUGIN = Path(__file__).parent.parent / "fault_plugin"

SCRIPT = """
import os, sys, time
import fiber
from fiber.backend import JobCreationError

sys.path.insert(0, {tests!r})
from procs import processes_with

def slow(x):
    # (the first task run opens the gate of the refusal: FAULTY_REFUSE_WHEN)
    open(os.environ["FAULTY_REFUSE_WHEN"], "a").close()
    time.sleep(0.2)
    return x

def children(pid):
    try:
        with open(f"/proc/{{pid}}/task/{{pid}}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []

def workers():
    # the jobs of this run: the children of the local backend's template, itself a
    # child of this process (it stays until exit)
    return [job for template in children(os.getpid()) for job in children(template)]

if __name__ == "__main__":
    pool = fiber.Pool(3)
    # the first worker is up before the map (it would otherwise break before use)
    deadline = time.monotonic() + 30
    while not workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("started", len(workers()), flush=True)
    t = time.monotonic()
    try:
        pool.map(slow, range(12))
    except JobCreationError as exc:
        print("raised", round(time.monotonic() - t, 2), exc, flush=True)
    deadline = time.monotonic() + 10
    while workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    print("released", not workers(), round(time.monotonic() - t, 2), flush=True)
    pool.terminate()
"""


def test_pool_raises_and_ends_the_workers_it_started(run_script, tmp_path):
    token = secrets.token_hex(8)
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(FAULT_PLUGIN),
                                                     os.environ.get("PYTHONPATH")) if p),
           "FIBER_BACKEND": "faulty", "FAULTY_CREATE_PERMANENT_AFTER": "1",
           "FAULTY_REFUSE_WHEN": str(tmp_path / "a-task-ran"),
           "PARTIAL_START_TOKEN": token}
    result = run_script(SCRIPT.format(tests=str(Path(__file__).parent.parent), token=token),
                        env=env, timeout=90)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "started 1" in out, out + result.stderr
    raised = [line for line in out.splitlines() if line.startswith("raised ")]
    assert raised, out + result.stderr
    assert float(raised[0].split()[1]) < 5, raised[0]
    assert "quota reached" in raised[0]
    released = [line for line in out.splitlines() if line.startswith("released ")]
    assert released and released[0].split()[1] == "True", out + result.stderr
    assert float(released[0].split()[2]) < 10, released[0]
    assert not processes_with(token), "a process of the run outlived it"
