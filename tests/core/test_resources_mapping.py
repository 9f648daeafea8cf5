"""Each backend's mapping of a resource request (``fiber.Resources``, carried on the
JobSpec) to its engine's terms, and its refusals, checked on the pieces that build the
engine's request: the Slurm batch script's directives, the Kubernetes pod manifest and
the backends' ``check_resources``. No engine runs here (these are the functions the
backends hand to sbatch and the API server); the plugins must be installed."""

from __future__ import annotations

import pytest

from fiber.backend import ConfigError, JobSpec, Resources


def _spec(resources: Resources, backend: str) -> JobSpec:
    return JobSpec(command=["python", "-c", "pass"], name="fiber-x", cpu=resources.cpu,
                   memory=resources.memory, gpu=resources.gpu,
                   walltime=resources.walltime, extra=resources.extra_for(backend),
                   labels={"fiber.run": "r1", "fiber.parent": "p1"})


def test_slurm_directives_carry_the_request():
    script = pytest.importorskip("fiber_slurm.script")
    request = Resources(cpu=2, memory="4G", gpu=1, walltime="1-01:00:00",
                        extra={"slurm": {"partition": "debug", "qos": "low",
                                         "constraint": "haswell"},
                               "kubernetes": {"node_selector": {"a": "b"}}})
    lines = script.sbatch_directives(_spec(request, "slurm"),
                                     {"slurm_partition": "main", "slurm_time": "5"}, "/o")
    for wanted in ('--cpus-per-task="2"', '--mem="4096M"', '--gres="gpu:1"',
                   '--time="1-01:00:00"', '--partition="debug"', '--qos="low"',
                   '--constraint="haswell"'):
        assert any(wanted in line for line in lines), (wanted, lines)
    assert not any('"main"' in line or '--time="5"' in line for line in lines), lines


def test_kubernetes_pod_carries_the_request():
    manifest = pytest.importorskip("fiber_k8s.manifest")
    request = Resources(cpu=0.5, memory=256, walltime=90, extra={"kubernetes": {
        "node_selector": {"disk": "ssd"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}})
    pod = manifest.pod_manifest(_spec(request, "kubernetes"), pod_name="p", namespace="ns",
                                image="img", instance="i", options={
                                    "kubernetes_node_selector": {"zone": "a"}})
    container = pod["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "500m", "memory": "256Mi"}
    assert pod["spec"]["nodeSelector"] == {"zone": "a", "disk": "ssd"}
    assert pod["spec"]["tolerations"] == [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["spec"]["activeDeadlineSeconds"] == 90


@pytest.mark.parametrize(("module", "cls", "options"), [
    ("fiber_docker.backend", "DockerBackend", {}),
    ("fiber_k8s.backend", "KubernetesBackend", {}),
])
def test_unknown_extras_are_refused_before_any_job(module, cls, options):
    backend_cls = getattr(pytest.importorskip(module), cls)
    backend = backend_cls.__new__(backend_cls)  # check_resources needs no cluster
    backend.name = backend_cls.name
    with pytest.raises(ConfigError, match=rf"extra\['{backend.name}'\]\['partition'\]"):
        backend.check_resources(Resources(extra={backend.name: {"partition": "x"}}))
    # another backend's extras are ignored
    backend.check_resources(Resources(cpu=1, extra={"slurm": {"partition": "x"}}))


def test_docker_refuses_walltime_and_kubernetes_a_bad_selector():
    docker = pytest.importorskip("fiber_docker.backend").DockerBackend
    backend = docker.__new__(docker)
    with pytest.raises(ConfigError, match="docker backend cannot honour a walltime"):
        backend.check_resources(Resources(walltime=60))
    k8s = pytest.importorskip("fiber_k8s.backend").KubernetesBackend
    backend = k8s.__new__(k8s)
    with pytest.raises(ConfigError, match="bad kubernetes resource request"):
        backend.check_resources(Resources(extra={"kubernetes": {"node_selector": "nokey"}}))
