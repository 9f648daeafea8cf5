"""What a job's container looks like and how it ends, against the real test engine:
limits, labels, init and network; OOM kills, signal exit codes, external kills; one
engine call for many statuses; finding and cleaning jobs by label; kept containers;
mounts of the working directory and of volumes; the default image and nested jobs
from inside a container."""

from __future__ import annotations

import os
import sys
import textwrap
import time
import uuid

import pytest

from fiber.backend.job import JobSpec, JobState


@pytest.fixture
def jobs(backend):
    """``jobs(backend, spec)`` creates a job that is terminated and released after
    the test."""
    created = []

    def create(spec: JobSpec, on=None):
        owner = on or backend
        job = owner.create_job(spec)
        created.append((owner, job))
        return job

    yield create
    for owner, job in created:
        owner.terminate(job, force=True)
        owner.wait(job, 30)
        owner.release(job)


def _py(code: str, labels, **fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", textwrap.dedent(code)], labels=labels,
                   name=fields.pop("name", "dockertest"), **fields)


def _wait_running(backend, job, timeout=60):
    deadline = time.monotonic() + timeout
    while backend.status(job).state is not JobState.RUNNING:
        assert not backend.status(job).is_final, backend.logs(job)
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_limits_labels_init_and_network(backend, jobs, run_labels, engine_client):
    spec = _py("import time; time.sleep(60)", run_labels, cpu=0.5, memory=96,
               env={"A_VAR": "a value"}, cwd="/tmp", name="limits job")
    job = jobs(spec)
    attrs = engine_client.api.inspect_container(job.id)
    host = attrs["HostConfig"]
    assert host["NanoCpus"] == 500_000_000
    assert host["Memory"] == 96 * 1024 * 1024
    assert host["Init"] is True
    assert host["NetworkMode"] == "host"
    assert host["PidMode"] == "host"
    labels = attrs["Config"]["Labels"]
    assert {k: labels[k] for k in run_labels} == run_labels
    assert labels["fiber.backend"] == "docker" and labels["fiber.name"] == "limits job"
    assert attrs["Config"]["Cmd"] == spec.command
    assert "A_VAR=a value" in attrs["Config"]["Env"]
    assert attrs["Config"]["WorkingDir"] == "/tmp"
    assert attrs["Name"].startswith("/fiber-limits-job-")


def test_process_ids_are_unique_across_jobs(make_backend, jobs, run_labels):
    """By default jobs share the host's PID namespace (like processes do); with
    docker_pid_host=false each has its own (and its pid is small)."""
    backend = make_backend()
    code = "import os; print('pid', os.getpid(), flush=True)"
    shared = [jobs(_py(code, run_labels), on=backend) for _ in range(2)]
    pids = []
    for job in shared:
        assert backend.wait(job, 60).state is JobState.SUCCEEDED
        logs = backend.logs(job)
        assert "tini" not in logs.lower(), logs  # the init runs quietly as a subreaper
        pids.append(int(logs.split("pid ")[1].split()[0]))
    assert len(set(pids)) == 2 and min(pids) > 1
    private = make_backend(docker_pid_host=False)
    job = jobs(_py(code, run_labels), on=private)
    assert private.wait(job, 60).state is JobState.SUCCEEDED
    assert int(private.logs(job).split("pid ")[1].split()[0]) < 10


def test_oom_kill_is_reported(backend, jobs, run_labels):
    job = jobs(_py("x = bytearray(512 * 1024 * 1024); print('survived')", run_labels,
                   memory=48))
    status = backend.wait(job, 60)
    assert status.state is JobState.FAILED
    assert status.reason == "OOMKilled"
    assert status.exitcode == -9
    assert "survived" not in backend.logs(job)


def test_external_kill_fails_and_terminate_cancels(backend, jobs, run_labels, engine_client):
    marker = "marker-" + uuid.uuid4().hex
    killed = jobs(_py(f"import time; time.sleep(120)  # {marker}", run_labels))
    stopped = jobs(_py(f"import time; time.sleep(120)  # {marker}", run_labels))
    _wait_running(backend, killed)
    _wait_running(backend, stopped)
    engine_client.api.kill(killed.id)  # `docker kill`: SIGKILL from outside fiber
    backend.terminate(stopped)
    assert backend.wait(killed, 30) == backend.status(killed)
    assert (backend.status(killed).state, backend.status(killed).exitcode) == (JobState.FAILED, -9)
    assert backend.status(killed).reason == "SIGKILL"
    status = backend.wait(stopped, 30)
    assert (status.state, status.exitcode) == (JobState.CANCELLED, -15)
    assert _processes_with(marker) == []  # the kill reached the command, not just the init


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            pass
    return found


def test_poll_answers_many_jobs_with_one_engine_call(backend, jobs, run_labels, monkeypatch):
    many = [jobs(_py("import time; time.sleep(60)", run_labels)) for _ in range(4)]
    done = jobs(_py("import sys; sys.exit(7)", run_labels))
    backend.wait(done, 60)
    for job in many:
        _wait_running(backend, job)
    # private: the backend's docker client, wrapped to count the calls polling makes
    api = backend._connect().api
    calls = []
    for name in ("containers", "inspect_container"):
        real = getattr(api, name)
        monkeypatch.setattr(api, name, lambda *a, _r=real, _n=name, **k: calls.append(_n)
                            or _r(*a, **k))
    statuses = backend.poll([*many, done])
    assert [statuses[j.id].state for j in many] == [JobState.RUNNING] * 4
    assert statuses[done.id].exitcode == 7
    assert calls == ["containers"]  # the ended job's status was cached by wait()


def test_list_jobs_then_terminate_and_release_cleans_a_run(make_backend, run_labels,
                                                            engine_client):
    """What `fiber clean` does: a fresh backend finds a run's containers by label and
    ends them; nothing of the run is left."""
    creator = make_backend()
    for i in range(3):
        creator.create_job(_py(f"import time; print({i}); time.sleep(120)", run_labels))
    cleaner = make_backend()
    found = cleaner.list_jobs({"fiber.run": run_labels["fiber.run"]})
    assert len(found) == 3
    assert all(job.spec.labels["fiber.parent"] == "dockertest" for job in found)
    assert found[0].spec.command[:2] == [sys.executable, "-c"]
    for job in found:
        cleaner.terminate(job, force=True)
        cleaner.release(job)
    assert cleaner.list_jobs(run_labels) == []
    assert engine_client.api.containers(all=True, filters={
        "label": f"fiber.run={run_labels['fiber.run']}"}) == []


def test_keep_containers_keeps_ended_containers(make_backend, run_labels, engine_client):
    backend = make_backend(docker_keep_containers=True)
    job = backend.create_job(_py("print('kept')", run_labels))
    try:
        assert backend.wait(job, 60).state is JobState.SUCCEEDED
        backend.release(job)
        assert [j.id for j in backend.list_jobs(run_labels)] == [job.id]
        assert "kept" in backend.logs(job)
        assert backend.status(job).state is JobState.SUCCEEDED
    finally:
        engine_client.api.remove_container(job.id, force=True)


def test_cwd_is_mounted_by_default(make_backend, jobs, run_labels, tmp_path):
    (tmp_path / "input.txt").write_text("from the host")
    code = """
        import os
        print('read:', open('input.txt').read(), flush=True)
        open('output.txt', 'w').write('from the job')
    """
    backend = make_backend()
    job = jobs(_py(code, run_labels, cwd=str(tmp_path)), on=backend)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED, backend.logs(job)
    assert "read: from the host" in backend.logs(job)
    assert (tmp_path / "output.txt").read_text() == "from the job"


def test_cwd_mount_can_be_turned_off(make_backend, jobs, run_labels, tmp_path):
    (tmp_path / "input.txt").write_text("from the host")
    backend = make_backend(docker_mount_cwd=False)
    code = "import os; print('cwd', os.getcwd(), sorted(os.listdir('.')), flush=True)"
    job = jobs(_py(code, run_labels, cwd=str(tmp_path)), on=backend)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED, backend.logs(job)
    assert f"cwd {tmp_path} []" in backend.logs(job)


def test_extra_volumes_read_only(make_backend, jobs, run_labels, tmp_path):
    (tmp_path / "data.txt").write_text("volume data")
    volumes = [*make_backend().options["docker_volumes"], f"{tmp_path}:/data:ro"]
    backend = make_backend(docker_volumes=volumes)
    code = """
        print(open('/data/data.txt').read(), flush=True)
        try:
            open('/data/new.txt', 'w')
        except OSError as exc:
            print('write refused', exc.errno, flush=True)
    """
    job = jobs(_py(code, run_labels), on=backend)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED, backend.logs(job)
    assert "volume data" in backend.logs(job) and "write refused 30" in backend.logs(job)
    assert not (tmp_path / "new.txt").exists()


def test_network_setting(make_backend, jobs, run_labels, engine_client):
    backend = make_backend(docker_network="none")
    assert backend.listen_address() == "127.0.0.1"
    job = jobs(_py("print('isolated')", run_labels), on=backend)
    assert backend.wait(job, 60).state is JobState.SUCCEEDED
    assert engine_client.api.inspect_container(job.id)["HostConfig"]["NetworkMode"] == "none"


def test_default_image_and_nested_jobs_inside_a_container(backend, make_backend, jobs,
                                                          run_labels, engine_client,
                                                          docker_engine, tmp_path):
    """A parent inside a container (with the engine's socket, mounted by default)
    defaults to its own image and starts jobs of its own; its working directory, a
    bind mount of host directory X at another path in its container, is mounted into
    them from X (paths translated through the parent container's mounts)."""
    code = f"""
        import sys
        from fiber.backend.job import JobSpec
        from fiber_docker.backend import DockerBackend
        inner = DockerBackend({{}})
        # private read: the image a nested backend picks by default
        print('image=' + inner._image(JobSpec(command=[])), flush=True)
        write = 'open("nested.txt", "w").write("from the nested job"); print("nested-ok")'
        job = inner.create_job(JobSpec(command=[sys.executable, '-c', write], cwd='/fiber-outer-dir',
                                       labels={run_labels!r}, name='nested'))
        status = inner.wait(job, 60)
        print('nested', status.state.value, inner.logs(job).strip(), flush=True)
        inner.release(job)
        inner.close()
    """
    volumes = [*backend.options["docker_volumes"], f"{tmp_path}:/fiber-outer-dir"]
    outer_backend = make_backend(docker_volumes=volumes)
    outer = jobs(_py(code, run_labels, name="outer", cwd="/fiber-outer-dir"), on=outer_backend)
    assert outer_backend.wait(outer, 120).state is JobState.SUCCEEDED, backend.logs(outer)
    logs = backend.logs(outer)
    image_id = engine_client.images.get(docker_engine["FIBER_IMAGE"]).id
    assert f"image={image_id}" in logs
    assert "nested succeeded nested-ok" in logs
    assert (tmp_path / "nested.txt").read_text() == "from the nested job"
    assert [j.spec.name for j in backend.list_jobs(run_labels)] == ["outer"]
