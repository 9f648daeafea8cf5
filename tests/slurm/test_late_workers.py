"""Workers that come up late get work, on the real Slurm test cluster (issue #19).

A pool of two Slurm jobs takes a map of eight long tasks, each of its two workers
holding some it has not started; then the pool grows to eight, and Slurm grants the six
new jobs over the next second or so, as a cluster grants workers over time. The late
workers take back what the first two hold but have not begun (recall), so the map runs
on all eight workers. Every execution is recorded in a file by the task itself (the
test cluster's jobs run on this host), so a task run twice would be seen, not just its
result. The same on the local backend, with arrivals spread by a test backend:
tests/core/test_pool_late_workers.py.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import fiber

SECONDS = 4.0


def _long(item: int, records: str) -> int:
    began = time.time()
    time.sleep(SECONDS)
    Path(records, f"ran-{item}-{os.getpid()}").write_text(repr(began))
    return os.getpid()


def _connected(pool) -> int:
    return sum(1 for w in pool.stats().workers if w.state in ("idle", "busy"))


@pytest.mark.usefixtures("slurm_cluster")
def test_jobs_granted_after_the_map_began_take_back_unstarted_tasks(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    with fiber.Pool(2) as pool:
        deadline = time.monotonic() + 120
        while _connected(pool) < 2:
            assert time.monotonic() < deadline, "the first two workers never connected"
            time.sleep(0.1)
        began = time.monotonic()
        result = pool.starmap_async(_long, [(i, str(records)) for i in range(8)],
                                    chunksize=1)
        pool.resize(8)  # six more Slurm jobs, granted while the first two run
        pids = result.get(180)
        took = time.monotonic() - began
        recalled = pool.stats().recalled
    runs: dict[int, list[int]] = {}
    for p in records.glob("ran-*"):
        _, item, pid = p.name.split("-")
        runs.setdefault(int(item), []).append(int(pid))
    assert sorted(runs) == list(range(8))
    twice = {item: r for item, r in runs.items() if len(r) != 1}
    assert not twice, f"tasks run more than once: {twice}"
    assert len(set(pids)) == 8, (
        f"{len(set(pids))} workers ran the 8 tasks ({recalled} given back)")
    assert recalled > 0  # the first two held tasks that went to later workers
    # two task-lengths (the first two workers' first tasks, then everyone's), plus the
    # Slurm start of the later jobs; without recall the first two run 3-4 tasks each
    assert took < 3 * SECONDS, f"the map took {took:.1f} s"
