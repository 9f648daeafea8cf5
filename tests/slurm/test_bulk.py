"""Jobs in bulk on the real Slurm test cluster: ``create_jobs`` submits one job array
per group (one ``sbatch``), each task with its own environment, secrets file and
output; pending tasks are seen one by one; a Pool starts as one array, a killed task is
replaced, and terminate leaves nothing (squeue, output and secrets files)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import fiber
from fiber.backend import Job, JobSpec, JobState
from fiber.runtime.run import run_id
from fiber_slurm import script
from fiber_slurm.backend import secrets_path


def _specs(run: str, count: int, cpu: float | None = None,
           code: str = "import os; print('task', os.environ['TASK_VALUE'], "
                       "os.path.exists(os.environ['_FIBER_SECRETS_FILE']))") -> list[JobSpec]:
    return [JobSpec(command=[sys.executable, "-c", code], env={"TASK_VALUE": f"v{i}"},
                    cwd=os.getcwd(), cpu=cpu, name=f"bulk-{i}",
                    labels={"fiber.run": run, "fiber.parent": "bulktest"},
                    secrets={"BULK_SECRET": f"bulk-secret-{i}-value"})
            for i in range(count)]


def _sbatch_counter(backend) -> list[str]:
    """Record the backend's sbatch calls, args and script (the real command runs)."""
    calls: list[str] = []
    real = backend.commands.run

    def run(name, args, **kwargs):
        if name == "sbatch":
            calls.append(" ".join(args) + "\n" + (kwargs.get("stdin") or ""))
        return real(name, args, **kwargs)

    backend.commands.run = run
    return calls


def test_create_jobs_is_one_array_with_each_tasks_own_environment(backend, run_id,
                                                                   squeue_live):
    calls = _sbatch_counter(backend)
    jobs = backend.create_jobs(_specs(run_id, 5))
    assert len(calls) == 1
    assert all(isinstance(job, Job) for job in jobs)
    array = jobs[0].id.split("_")[0]
    assert [job.id for job in jobs] == [f"{array}_{i}" for i in range(5)]
    for job in jobs:
        secrets_file = secrets_path(job.handle.output)
        assert os.stat(secrets_file).st_mode & 0o777 == 0o600
        assert "bulk-secret-" not in calls[0] and "--array" in calls[0]
    for i, job in enumerate(jobs):
        status = backend.wait(job, 60)
        assert status is not None and status.state is JobState.SUCCEEDED
        assert f"task v{i} True" in backend.logs(job)
        assert [line for line in backend.logs(job).splitlines() if "task" in line] == [
            f"task v{i} True"]
    outputs = [job.handle.output for job in jobs]
    for job in jobs:
        backend.release(job)
    for output in outputs:
        assert not os.path.exists(output) and not os.path.exists(secrets_path(output))
    assert squeue_live(script.job_name({"fiber.run": run_id})) == []


def test_pending_tasks_are_seen_and_ended_one_by_one(backend, run_id, squeue_live):
    """3 tasks of 40 CPUs on a 64-CPU node: one runs, two are pending, each is polled
    as such (not lost); terminate_jobs cancels them all, and list_jobs finds them by
    task id before."""
    jobs = backend.create_jobs(_specs(run_id, 3, cpu=40,
                                      code="import time; time.sleep(600)"))
    assert all(isinstance(job, Job) for job in jobs)
    try:
        deadline = time.monotonic() + 60
        while True:
            states = sorted(s.state.value for s in backend.poll(jobs).values())
            if states == ["pending", "pending", "running"]:
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        listed = backend.list_jobs({"fiber.run": run_id})
        assert sorted(job.id for job in listed) == sorted(job.id for job in jobs)
        assert backend.terminate_jobs(jobs) == {}
        for job in jobs:
            status = backend.wait(job, 30)
            assert status is not None and status.state is JobState.CANCELLED
    finally:
        backend.terminate_jobs(jobs, force=True)
        for job in jobs:
            backend.wait(job, 30)
            backend.release(job)
    assert squeue_live(script.job_name({"fiber.run": run_id})) == []


def task_id(x: int) -> str:
    time.sleep(0.1)
    return os.environ.get("SLURM_ARRAY_TASK_ID", "")


def live_workers(pool) -> list:
    return [w for w in pool.stats().workers
            if w.state in ("idle", "busy") and w.process is not None]


def test_pool_is_one_array_a_killed_task_is_replaced_and_nothing_is_left(
        slurm_cluster, squeue_live):
    run = run_id()
    pool = fiber.Pool(16)
    outputs = []
    try:
        deadline = time.monotonic() + 180
        while len(live_workers(pool)) < 16:
            assert time.monotonic() < deadline, "the workers never connected"
            time.sleep(0.2)
        ids = sorted(w.process.job_id for w in live_workers(pool))
        arrays = {job_id.split("_")[0] for job_id in ids}
        assert len(arrays) == 1, ids  # one sbatch
        assert sorted(int(job_id.split("_")[1]) for job_id in ids) == list(range(16))
        outputs = [w.process.job.handle.output for w in live_workers(pool)]
        assert len(set(outputs)) == 16
        assert set(squeue_live(f"fiber-{run}")) >= set(ids)
        victim = live_workers(pool)[3].process
        subprocess.run(["scancel", victim.job_id], check=True)
        victim.join(60)
        assert victim.exitcode is not None
        deadline = time.monotonic() + 120
        while True:
            now = {w.process.job_id for w in live_workers(pool)}
            if len(now) == 16 and victim.job_id not in now:
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.2)
        assert len(set(pool.map(task_id, range(64), chunksize=1)) - {""}) >= 1
        assert pool.map(abs, range(-50, 0)) == list(range(50, 0, -1))
    finally:
        pool.terminate()
        pool.join()
    deadline = time.monotonic() + 60
    while squeue_live(f"fiber-{run}"):
        assert time.monotonic() < deadline, squeue_live(f"fiber-{run}")
        time.sleep(0.2)
    deadline = time.monotonic() + 30
    left = outputs
    while left:
        left = [path for path in outputs
                if os.path.exists(path) or os.path.exists(secrets_path(path))]
        assert time.monotonic() < deadline, left
        time.sleep(0.2)


def test_array_script_gives_each_task_its_own_environment(tmp_path):
    """The rendered array script, run by bash with each task id (its exec replaced by
    printing the environment): each task sees the shared variables and its own, values
    with quotes and spaces intact; a task id outside the array fails loudly."""
    specs = [JobSpec(command=["env"], env={"SHARED": "a b 'c'", "OWN": f"it's {i}",
                                           **({"ONLY_ONE": "x"} if i == 1 else {})},
                     name=f"t{i}") for i in range(3)]
    text = script.render_array(specs, {}, str(tmp_path / "out-%a.out"))
    assert '#SBATCH --array="0-2"' in text and text.count("SHARED=") == 1
    for i in range(3):
        done = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"],
                                   "SLURM_ARRAY_TASK_ID": str(i)})
        assert done.returncode == 0, done.stderr
        env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        assert env["SHARED"] == "a b 'c'" and env["OWN"] == f"it's {i}"
        assert ("ONLY_ONE" in env) == (i == 1)
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "SLURM_ARRAY_TASK_ID": "7"})
    assert done.returncode == 1 and "not in this job array" in done.stderr
