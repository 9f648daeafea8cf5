"""Resources on the real Slurm test cluster: a Process's and a Pool's request reach
``scontrol show job`` (CPUs per task, memory, time limit, partition from
``Resources.extra["slurm"]``), and what the cluster cannot honour (a GPU: the test
node offers no gpu gres; an unknown extra) is refused before any job is submitted."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

import fiber
from fiber.backend import ConfigError


def _scontrol(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,
                         text=True, check=True).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def _hold(seconds):
    time.sleep(seconds)


def _where(_):
    time.sleep(0.02)
    return os.getpid(), os.getppid()


def _our_jobs() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                         check=True).stdout
    return set(out.split())


@pytest.mark.usefixtures("slurm_cluster")
def test_process_resources_reach_scontrol():
    partition = os.environ["FIBER_SLURM_PARTITION"]
    p = fiber.Process(target=_hold, args=(60,), resources=fiber.Resources(
        cpu=2, memory="200M", walltime="0:05:00", extra={"slurm": {"partition": partition}}))
    p.start()
    try:
        info = _scontrol(p.job_id)
        assert info["CPUs/Task"] == "2"
        assert info["MinMemoryNode"] == "200M"
        assert info["TimeLimit"] == "00:05:00"
        assert info["Partition"] == partition
    finally:
        p.terminate()
        p.join(60)


@pytest.mark.usefixtures("slurm_cluster")
def test_pool_resources_reach_every_worker():
    with fiber.Pool(2, resources={"walltime": 600}) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
        ids = [w.process.job_id for w in pool.stats().workers if w.process is not None]
        assert ids
        for job_id in ids:
            assert _scontrol(job_id)["TimeLimit"] == "00:10:00"


@pytest.mark.usefixtures("slurm_cluster")
def test_what_slurm_cannot_honour_is_refused_before_any_job():
    before = _our_jobs()
    with pytest.raises(ConfigError, match="no node of this cluster offers a gpu"):
        fiber.Pool(2, resources={"gpu": 1})
    with pytest.raises(ConfigError, match=r"extra\['slurm'\]\['nodes'\]"):
        fiber.Pool(2, resources={"extra": {"slurm": {"nodes": 4}}})
    # no job was submitted (those of an earlier test may leave the queue meanwhile)
    assert _our_jobs() - before == set()


@pytest.mark.usefixtures("slurm_cluster")
def test_pool_runs_several_workers_per_job():
    """Pool(8, workers_per_job=4): two Slurm jobs, each asking for four times a
    worker's request, each running four workers the pool counts one by one."""
    with fiber.Pool(8, workers_per_job=4, resources={"cpu": 1, "memory": "64M"}) as pool:
        pairs = pool.map(_where, range(64), chunksize=1)
        stats = pool.stats()
        ids = {w.process.job_id for w in stats.workers if w.process is not None}
        assert len(stats.workers) == 8
        assert len(ids) == 2, ids
        for job_id in ids:
            info = _scontrol(job_id)
            assert info["CPUs/Task"] == "4"
            assert info["MinMemoryNode"] == "256M"
    assert len({ppid for _, ppid in pairs}) == 2
