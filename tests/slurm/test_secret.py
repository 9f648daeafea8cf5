"""The run's secret on the real Slurm test cluster: a fiber Process that authenticated
to its parent (it answers through a Queue) holds it, yet it is in nothing Slurm shows
or keeps of the job: not in `scontrol show job -dd`, not in the batch script Slurm
stored (`scontrol write batch_script`), not in the environment slurmctld saved for the
job (its StateSaveLocation), not on a command line (`ps -eo args`). It travels in a
0600 secrets file next to the job's output, which the job removes once read and the
backend removes with the job. (The cluster has no accounting storage, so `sacct` has
nothing to show.)"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import stat
import subprocess
import sys
import textwrap

import fiber
from fiber.backend.job import JobSpec, JobState
from fiber.wire import auth
from fiber_slurm.backend import secrets_path


def _report(q, go):
    # the job holds the run's secret, and took it out of its environment once read (so
    # the programs its tasks start do not inherit it)
    key = ("still in the environment" if "_FIBER_AUTHKEY" in os.environ
           else auth.get_authkey().hex())
    q.put((hashlib.sha256(key.encode()).hexdigest(), os.environ.get("_FIBER_SECRETS_FILE")))
    go.get()
    q.put("authenticated")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _stored_environment(job_id: str) -> list[str]:
    """The environment files slurmctld saved for the job (StateSaveLocation)."""
    config = _run("scontrol", "show", "config")
    state = re.search(r"^StateSaveLocation\s*=\s*(\S+)", config, re.MULTILINE).group(1)
    return glob.glob(os.path.join(state, "hash.*", f"job.{job_id}", "environment"))


def _onlookers_see(key: str, job_id: str) -> dict[str, bool]:
    shown = {
        "scontrol show job -dd": _run("scontrol", "-dd", "show", "job", job_id),
        "batch script": _run("scontrol", "write", "batch_script", job_id, "-"),
        "ps -eo args": _run("ps", "-eo", "args"),
    }
    seen = {where: key in text for where, text in shown.items()}
    stored = _stored_environment(job_id)
    assert stored, "slurmctld's saved environment of the job was not found"
    for path in stored:
        with open(path, "rb") as f:
            seen[path] = key.encode() in f.read()
    assert "_FIBER_SECRETS_FILE" in shown["batch script"]  # the path, not the secret
    return seen


def test_no_onlooker_of_the_cluster_sees_the_secret(slurm_cluster):
    key = auth.get_authkey().hex()
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=_report, args=(q, go), name="secret-holder")
    p.start()
    try:
        digest, left = q.get(timeout=180)
        assert digest == hashlib.sha256(key.encode()).hexdigest()
        assert left is None  # read, and its variable gone
        job = p.job
        assert not any(_onlookers_see(key, job.id).values())
        assert not os.path.exists(secrets_path(job.handle.output))  # removed by the job
        go.put(1)
        assert q.get(timeout=60) == "authenticated"
    finally:
        p.join(60)
    assert p.exitcode == 0


def test_secrets_file_is_private_and_sbatch_records_no_secret(backend, run_id,
                                                              monkeypatch):
    secret = os.urandom(32).hex()
    # this process holds the secret in its environment, as a job of the run does:
    # --export=ALL must not take it into the job's stored environment
    monkeypatch.setenv("FIBER_TEST_SECRET", secret)
    digest = hashlib.sha256(f"FIBER_TEST_SECRET={secret}\n".encode()).hexdigest()
    check = textwrap.dedent(f"""
        import hashlib, os, stat, sys, time
        path = os.environ["_FIBER_SECRETS_FILE"]
        st = os.stat(path)
        ok = (stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
              and hashlib.sha256(open(path, "rb").read()).hexdigest() == {digest!r}
              and "FIBER_TEST_SECRET" not in os.environ)
        print("ok" if ok else "not ok", flush=True)
        time.sleep(2)
        sys.exit(0 if ok else 3)
    """)
    spec = JobSpec(command=[sys.executable, "-c", check], name="secretfile",
                   labels={"fiber.run": run_id, "fiber.parent": "test"},
                   secrets={"FIBER_TEST_SECRET": secret})
    job = backend.create_job(spec)
    path = secrets_path(job.handle.output)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert not any(_onlookers_see(secret, job.id).values())
        status = backend.wait(job, 90)
        assert status is not None and status.state is JobState.SUCCEEDED, backend.logs(job)
    finally:
        backend.terminate(job, force=True)
        backend.wait(job, 30)
        backend.release(job)
    assert not os.path.exists(path)
