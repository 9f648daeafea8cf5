"""Bad input gets a clear error that says what to do: no engine, a missing image, no
image at all, bad volume specs, a missing bind source, a GPU the engine cannot give,
an unknown network. All against the real test engine (or a socket path where no
engine listens)."""

from __future__ import annotations

import sys

import pytest

from fiber.backend import ClusterUnreachableError, JobCreationError
from fiber.backend.job import JobSpec
from fiber.backend.options import ConfigError
from fiber.runtime import config
from fiber_docker.backend import DockerBackend


def _spec(run_labels, **fields) -> JobSpec:
    return JobSpec(command=[sys.executable, "-c", "print('x')"], name="bad-input",
                   labels=run_labels, **fields)


def test_no_engine_names_the_setting_and_how_to_start_docker(run_labels, tmp_path):
    backend = DockerBackend({"docker_host": f"unix://{tmp_path}/no-engine.sock",
                             "image": "fiber-test:any"})
    with pytest.raises(ClusterUnreachableError) as info:
        backend.create_job(_spec(run_labels))
    message = str(info.value)
    assert f"unix://{tmp_path}/no-engine.sock" in message
    assert "docker_host setting" in message and "FIBER_DOCKER_HOST" in message
    assert "DOCKER_HOST" in message and "dockerd" in message
    backend.close()


def test_no_engine_from_docker_host_env(run_labels, tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/gone.sock")
    backend = DockerBackend({"image": "fiber-test:any"})
    with pytest.raises(ClusterUnreachableError, match="from DOCKER_HOST"):
        backend.list_jobs(run_labels)


def test_missing_image_says_build_pull_or_set_fiber_image(backend, run_labels):
    with pytest.raises(JobCreationError) as info:
        backend.create_job(_spec(run_labels, image="fiber-no-such-image:0"))
    message = str(info.value)
    assert "'fiber-no-such-image:0'" in message
    assert "docker pull" in message and "build" in message and "FIBER_IMAGE" in message
    assert backend.list_jobs(run_labels) == []


def test_no_image_outside_a_container_asks_for_one(make_backend, run_labels, monkeypatch):
    monkeypatch.delenv("FIBER_IMAGE")
    backend = make_backend()
    assert backend.options["image"] is None
    with pytest.raises(JobCreationError) as info:
        backend.create_job(_spec(run_labels))
    assert "FIBER_IMAGE" in str(info.value) and "no image" in str(info.value)
    assert backend.list_jobs(run_labels) == []


@pytest.mark.parametrize("spec, complaint", [
    ("data:/data", None),  # a volume name is fine
    ("relative/dir:/data", "absolute path"),
    ("/data:relative", "container side"),
    ("/data:/data:rx", "mode 'rx'"),
    ("/data", "expected HOST_PATH:CONTAINER_PATH"),
    ("/a:/b:ro:extra", "expected HOST_PATH:CONTAINER_PATH"),
])
def test_volume_specs_are_validated_in_settings(docker_engine, monkeypatch, spec, complaint):
    monkeypatch.setenv("FIBER_DOCKER_VOLUMES", spec)
    if complaint is None:
        assert config.load().docker_volumes == [f"{spec}:rw"]
        return
    with pytest.raises(ConfigError) as info:
        config.load()
    message = str(info.value)
    assert "docker_volumes" in message and "FIBER_DOCKER_VOLUMES" in message
    assert complaint in message


def test_volume_specs_are_validated_by_the_backend():
    with pytest.raises(ConfigError, match="docker_volumes.*absolute path"):
        DockerBackend({"docker_volumes": ["./here:/there"]})
    with pytest.raises(ConfigError, match="two volumes are mounted at '/x'"):
        DockerBackend({"docker_volumes": ["/a:/x", "/b:/x:ro"]})


def test_missing_bind_source_names_the_setting(make_backend, run_labels, tmp_path):
    backend = make_backend(docker_volumes=[f"{tmp_path}/missing:/data:ro"])
    with pytest.raises(JobCreationError) as info:
        backend.create_job(_spec(run_labels))
    assert "does not exist" in str(info.value) and "docker_volumes" in str(info.value)
    assert backend.list_jobs(run_labels) == []


def test_gpu_without_gpu_support_is_a_clear_error(backend, run_labels):
    with pytest.raises(JobCreationError) as info:
        backend.create_job(_spec(run_labels, gpu=1))
    assert "GPU" in str(info.value)
    assert backend.list_jobs(run_labels) == []


def test_unknown_network_is_a_clear_error(make_backend, run_labels):
    backend = make_backend(docker_network="fiber-no-such-network")
    with pytest.raises(JobCreationError, match="docker_network"):
        backend.create_job(_spec(run_labels))
    with pytest.raises(ClusterUnreachableError, match="docker network create"):
        backend.listen_address()
    assert backend.list_jobs(run_labels) == []
