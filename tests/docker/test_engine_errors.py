"""The Docker rows of docs/backend-errors.md, against the real dockerd of the test engine
(tests/engines/docker.py): an engine that is not there, or that this user may not use,
fails at once with a hint; one that refuses connections or does not answer in time is
retried and the job runs.

How each fault is made real:

- no socket: ``docker_host`` names a path in an empty directory;
- permission denied: ``docker_host`` is a symlink to the engine's socket in a
  directory of mode 0700 owned by user ``nobody``, and the call runs in a child process
  of root with every capability dropped (``setpriv --bounding-set=-all``: root would
  pass any file mode), so the kernel refuses the path as it refuses a user outside the
  engine's group;
- connection refused: ``docker_host`` names a Unix socket that is bound but not
  listening (a daemon's socket file with no daemon behind it), replaced after 1.5 s
  by a symlink to the engine's socket (the daemon is back);
- time-out: dockerd is frozen (SIGSTOP) for 3 s with ``docker_timeout`` at 1 s;
- restart: dockerd is restarted with 2 s of no daemon.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from engines import docker as docker_engine

import fiber
from fiber.backend import ClusterUnreachableError, JobSpec, JobState
from fiber.runtime import retry


def _spec(labels: dict[str, str]) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", "print('ok')"], labels=dict(labels),
                   name="errors-row")


def _engine_socket() -> str:
    return os.environ["FIBER_DOCKER_HOST"].removeprefix("unix://")


def test_no_socket_fails_at_once_with_the_hint(docker_engine, tmp_path):
    """A program whose docker_host names no socket fails in seconds, not after the
    180 s retry budget (here 20 s, so the code before the fix fails this test in 20 s)."""
    missing = tmp_path / "docker.sock"
    ctx = fiber.get_context("docker", docker_host=f"unix://{missing}",
                            backend_retry_timeout=20)
    began = time.monotonic()
    with pytest.raises(ClusterUnreachableError) as caught:
        ctx.Process(target=abs, args=(1,)).start()
    elapsed = time.monotonic() - began
    assert elapsed < 5, f"failed after {elapsed:.1f} s"
    assert not caught.value.transient
    text = str(caught.value)
    assert f"the socket {missing} does not exist" in text, text
    assert "docker_host" in text and "dockerd" in text, text


def test_permission_denied_fails_at_once_with_the_hint(docker_engine, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    (locked / "docker.sock").symlink_to(_engine_socket())
    os.chown(locked, 65534, 65534)
    code = textwrap.dedent(f"""
        import json, sys, time
        from fiber.backend import JobSpec
        from fiber.runtime import retry
        from fiber_docker.backend import DockerBackend
        backend = DockerBackend({{"docker_host": {"unix://" + str(locked / "docker.sock")!r},
                                 "image": "unused"}})
        spec = JobSpec(command=["true"], name="denied")
        began = time.monotonic()
        try:
            retry.call("docker", "create a job", lambda: backend.create_job(spec), 20)
        except Exception as exc:
            print(json.dumps({{"type": type(exc).__name__, "text": str(exc),
                              "transient": getattr(exc, "transient", None),
                              "elapsed": time.monotonic() - began}}))
    """)
    done = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60)
    assert done.stdout.strip(), done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["type"] == "ClusterUnreachableError", result
    assert result["transient"] is False, result
    assert result["elapsed"] < 5, result
    assert "permission denied" in result["text"], result
    assert "usermod -aG docker" in result["text"], result


def test_refused_connection_is_retried(make_backend, run_labels, tmp_path):
    path = tmp_path / "docker.sock"
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # bound, never listening: connecting is refused

    def daemon_back() -> None:
        time.sleep(1.5)
        dead.close()
        path.unlink()
        path.symlink_to(_engine_socket())

    backend = make_backend(docker_host=f"unix://{path}", docker_mount_socket=False)
    thread = threading.Thread(target=daemon_back)
    thread.start()
    began = time.monotonic()
    try:
        job = retry.call("docker", "create a job",
                         lambda: backend.create_job(_spec(run_labels)), 30)
    finally:
        thread.join()
    assert time.monotonic() - began >= 1.5  # it was refused first, and retried
    assert backend.wait(job, 60).state is JobState.SUCCEEDED


def test_engine_time_out_is_retried_and_leaves_nothing(make_backend, run_labels,
                                                       engine_client):
    backend = make_backend(docker_timeout=1)
    backend.list_jobs(run_labels)  # connected: the calls below time out, not connect
    thaw = threading.Timer(3.0, docker_engine.thaw)
    docker_engine.freeze()
    thaw.start()
    began = time.monotonic()
    try:
        job = retry.call("docker", "create a job",
                         lambda: backend.create_job(_spec(run_labels)), 30)
    finally:
        thaw.join()
        docker_engine.thaw()
    assert time.monotonic() - began >= 2.5  # it timed out first, and was retried
    assert backend.wait(job, 60).state is JobState.SUCCEEDED
    backend.close()  # removes the job and any container a timed-out create made
    label = f"fiber.run={run_labels['fiber.run']}"
    deadline = time.monotonic() + 20
    while left := engine_client.api.containers(all=True, filters={"label": label}):
        assert time.monotonic() < deadline, f"containers left: {left}"
        time.sleep(0.2)


def test_daemon_restart_is_retried(make_backend, run_labels):
    """dockerd restarted (tests/engines/docker.py: restart, 2 s with no daemon) after
    this backend reached it: a job created while it is down waits for it, whether its
    socket is gone (dockerd removes it as it stops) or refuses."""
    backend = make_backend()
    backend.list_jobs(run_labels)  # the engine was reached
    socket_path = _engine_socket()
    thread = threading.Thread(target=docker_engine.restart, kwargs={"down_seconds": 2.0})
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # the daemon is down: its socket is gone or refuses
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(socket_path)
            except OSError:
                break
            assert time.monotonic() < deadline, "dockerd did not go down"
            time.sleep(0.05)
        job = retry.call("docker", "create a job",
                         lambda: backend.create_job(_spec(run_labels)), 60)
    finally:
        thread.join()
    assert backend.wait(job, 60).state is JobState.SUCCEEDED
