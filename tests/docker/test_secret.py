"""The run's secret is not in what `docker inspect` shows of a job's container (Env,
Cmd, Args, Config, Labels, Mounts: the whole inspection as JSON) nor in its processes'
command lines (`docker top`), while the job runs and has authenticated; it reaches
the job as a private file copied into the container. Real engine, real containers."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap
import time

import fiber
import fiber.runtime.run
from fiber.backend.job import JobSpec, JobState
from fiber.wire import auth
from fiber_docker import secretfile


def _report(q, go):
    # the job holds the run's secret, and took it out of its environment once read (so
    # the programs its tasks start do not inherit it)
    key = ("still in the environment" if "_FIBER_AUTHKEY" in os.environ
           else auth.get_authkey().hex())
    q.put((hashlib.sha256(key.encode()).hexdigest(), os.path.exists(secretfile.PATH),
           "_FIBER_SECRETS_FILE" in os.environ))
    go.get()
    q.put("authenticated")


def _container_of(engine_client, name: str) -> dict:
    rows = engine_client.api.containers(filters={
        "label": f"fiber.run={fiber.runtime.run.run_id()}", "status": "running"})
    rows = [r for r in rows if r["Labels"].get("fiber.name") == name]
    assert len(rows) == 1, rows
    return rows[0]


def test_docker_inspect_of_a_running_job_shows_no_secret(engine_client):
    key = auth.get_authkey().hex()
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=_report, args=(q, go), name="secret-holder")
    p.start()
    try:
        digest, file_left, variable_left = q.get(timeout=180)
        # the job holds the run's secret, in its environment; its file is gone
        assert digest == hashlib.sha256(key.encode()).hexdigest()
        assert not file_left and not variable_left
        row = _container_of(engine_client, "fiber-secret-holder")
        attrs = engine_client.api.inspect_container(row["Id"])
        assert f"_FIBER_SECRETS_FILE={secretfile.PATH}" in attrs["Config"]["Env"]
        assert key not in json.dumps(attrs)
        assert key not in json.dumps(row)
        top = engine_client.api.top(row["Id"], ps_args="-eo pid,args")
        assert top["Processes"] and key not in json.dumps(top)
        go.put(1)
        assert q.get(timeout=60) == "authenticated"
    finally:
        p.join(60)
    assert p.exitcode == 0


def test_secrets_file_is_private_to_the_job_and_goes_with_it(backend, run_labels,
                                                             engine_client):
    secret = os.urandom(32).hex()
    digest = hashlib.sha256(f"S={secret}\n".encode()).hexdigest()
    check = textwrap.dedent(f"""
        import hashlib, os, stat, sys, time
        st = os.stat({secretfile.PATH!r})
        text = open({secretfile.PATH!r}).read()
        ok = (stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
              and hashlib.sha256(text.encode()).hexdigest() == {digest!r}
              and os.environ["_FIBER_SECRETS_FILE"] == {secretfile.PATH!r})
        time.sleep(3)
        sys.exit(0 if ok else 3)
    """)
    spec = JobSpec(command=[sys.executable, "-c", check], labels=run_labels,
                   name="secretfile", secrets={"S": secret})
    job = backend.create_job(spec)
    try:
        attrs = engine_client.api.inspect_container(job.id)
        assert secret not in json.dumps(attrs)
        status = backend.wait(job, 60)
        assert status is not None and status.state is JobState.SUCCEEDED, backend.logs(job)
    finally:
        backend.terminate(job, force=True)
        backend.wait(job, 30)
        backend.release(job)
    deadline = time.monotonic() + 30
    while engine_client.api.containers(all=True, filters={"id": job.id}):
        assert time.monotonic() < deadline
        time.sleep(0.2)
