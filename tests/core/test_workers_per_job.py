"""Several pool workers per job (``Pool(workers_per_job=N)``, issue #16), on the local
backend with real processes: the pool counts workers, not jobs; a job's request is
the per-worker request times its workers; a job that is killed loses its N workers,
which the pool replaces, their tasks re-run elsewhere; a worker killed alone is lost
alone. Kills are real SIGKILLs of the job's or the worker's process."""

from __future__ import annotations

import collections
import functools
import os
import signal
import time

import fault_map
import pytest

import fiber
from fiber.backend import Resources


def where(i: int) -> tuple[int, int]:
    """(worker pid, its parent's pid: the job's process) after 20 ms."""
    time.sleep(0.02)
    return os.getpid(), os.getppid()


def _jobs(pool: fiber.Pool) -> dict[int, list[int]]:
    """{job pid: [worker ids]} of the pool's connected workers."""
    jobs: dict[int, list[int]] = collections.defaultdict(list)
    for w in pool.stats().workers:
        if w.process is not None and w.state in ("idle", "busy"):
            jobs[w.process.pid].append(w.id)
    return dict(jobs)


def test_workers_share_jobs_and_are_counted_one_by_one():
    with fiber.Pool(10, workers_per_job=4) as pool:
        result = pool.map(where, range(200), chunksize=1)
        stats = pool.stats()
    workers = {pid for pid, _ in result}
    jobs = {ppid for _, ppid in result}
    assert stats.processes == 10 and len(stats.workers) == 10
    # 10 workers in jobs of at most 4: three jobs (4, 4 and 2)
    assert len(jobs) == 3, collections.Counter(ppid for _, ppid in result)
    assert len(workers) <= 10
    assert len({w.process.pid for w in stats.workers}) == 3


def test_a_killed_job_loses_its_workers_and_they_are_replaced(tmp_path):
    log = tmp_path / "executions"
    n = 600
    with fiber.Pool(8, workers_per_job=4) as pool:
        pool.map(where, range(32), chunksize=1)  # every worker is up
        jobs = _jobs(pool)
        assert sorted(len(ids) for ids in jobs.values()) == [4, 4], jobs
        victim = next(iter(jobs))
        members = [pid for pid, ppid in pool.map(where, range(64), chunksize=1)
                   if ppid == victim]
        result = pool.map_async(functools.partial(fault_map.record, str(log)), range(n), chunksize=1)
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        assert result.get(120) == [i * i for i in range(n)]
        stats = pool.stats()
        # the job's four workers died with it (parent-death signal) and were replaced
        deadline = time.monotonic() + 10
        while any(fault_map.alive(pid) for pid in members) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(fault_map.alive(pid) for pid in members)
        assert stats.lost == 4, stats
        assert pool.map(abs, range(-16, 0)) == list(range(16, 0, -1))
        assert sum(len(ids) for ids in _jobs(pool).values()) == 8
        assert victim not in _jobs(pool)
    runs = fault_map.executions_in(str(log))
    assert set(runs) == set(range(n))
    # each of the four workers re-runs at most its task in progress
    assert sum(c - 1 for c in runs.values()) <= 4


def test_a_worker_killed_alone_is_lost_alone():
    with fiber.Pool(4, workers_per_job=4) as pool:
        pairs = set(pool.map(where, range(64), chunksize=1))
        (job,) = {ppid for _, ppid in pairs}
        members = sorted({pid for pid, _ in pairs})
        os.kill(members[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pool.stats().lost < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.map(abs, range(-40, 0)) == list(range(40, 0, -1))
        stats = pool.stats()
        assert stats.lost == 1
        assert fault_map.alive(job)  # its siblings go on in their job
        assert all(fault_map.alive(pid) for pid in members[1:])
        # the replacement is a job of one worker (on a loaded machine the map above may
        # end on the three survivors before the replacement has connected: wait for it)
        deadline = time.monotonic() + 30
        while sum(len(ids) for ids in _jobs(pool).values()) < 4 \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(len(ids) for ids in _jobs(pool).values()) == [1, 3]


def test_workers_per_job_is_checked():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="workers_per_job"):
            fiber.Pool(2, workers_per_job=bad)


def test_a_jobs_request_is_its_workers_request_times_their_number():
    request = Resources(cpu=0.5, memory="100M", gpu=1, walltime=60,
                        extra={"slurm": {"partition": "debug"}})
    job = request.scaled(4)
    assert (job.cpu, job.memory, job.gpu, job.walltime) == (2.0, 400, 4, 60)
    assert job.extra_for("slurm") == {"partition": "debug"}
    assert Resources().scaled(3) == Resources()
