"""fiber.Pool on the real Slurm test cluster: every worker is a Slurm job named and
commented with the run; a worker's job cancelled with ``scancel`` mid-map (as an
admin or the scheduler would) loses no task, and nothing is left afterwards."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.parse

import fiber
from fiber.runtime.run import run_id


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def live_workers(pool) -> list:
    return [w for w in pool.stats().workers
            if w.state in ("idle", "busy") and w.process is not None]


def test_scancelled_worker_loses_nothing(slurm_cluster, squeue_live):
    run = run_id()
    pool = fiber.Pool(3)
    try:
        result = pool.map_async(slow_square, range(300), chunksize=1)
        deadline = time.monotonic() + 120
        while len(live_workers(pool)) < 3:
            assert time.monotonic() < deadline, "the workers never connected"
            assert not result.ready()
            time.sleep(0.1)
        jobs = {w.process.job_id for w in live_workers(pool)}
        assert jobs <= set(squeue_live(f"fiber-{run}"))
        victim = live_workers(pool)[0].process
        info = subprocess.run(["scontrol", "-o", "show", "job", victim.job_id],
                              capture_output=True, text=True, check=True).stdout
        comment = dict(urllib.parse.parse_qsl(re.search(r"Comment=(\S+)", info).group(1)))
        assert comment["fiber.run"] == run and comment["fiber.parent"]
        assert not result.ready(), "the map ended before a worker could be cancelled"
        subprocess.run(["scancel", victim.job_id], check=True)
        assert result.get(300) == [x * x for x in range(300)]
        victim.join(60)
        assert victim.exitcode is not None and victim.exitcode < 0
    finally:
        pool.terminate()
        pool.join()
    deadline = time.monotonic() + 60
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, squeue_live(f"fiber-{run}")
        time.sleep(0.2)
