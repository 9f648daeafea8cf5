"""A backend per context on real engines: one program keeps a Manager on the local
backend, runs a Process on docker and a Pool on Slurm at once (the slurm engine is
started here through tests/engines/slurm.py when this session did not start it, and
stopped at the end); and a docker Process's resource request reaches the container's
HostConfig (``docker inspect``)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

import fiber
from fiber.backend import ConfigError

ENGINES = Path(__file__).resolve().parents[1] / "engines"


def _report(shared, key):
    shared[key] = (fiber.get_config_value("backend"), os.getpid())


def _square(args):
    shared, x = args
    shared[f"slurm-{x}"] = (fiber.get_config_value("backend"), os.getpid())
    return x * x


def _hold(seconds):
    time.sleep(seconds)


@pytest.fixture(scope="module")
def slurm_settings(docker_engine):
    pytest.importorskip("fiber_slurm", reason="the mixed test needs fiber-slurm installed")
    if os.environ.get("SLURM_CONF"):
        yield {}
        return
    spec = importlib.util.spec_from_file_location("fiber_test_engine_slurm_mixed",
                                                  ENGINES / "slurm.py")
    assert spec is not None and spec.loader is not None
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    settings = engine.start()
    os.environ["SLURM_CONF"] = settings.pop("SLURM_CONF")
    try:
        yield {key[len("FIBER_"):].lower(): value for key, value in settings.items()}
    finally:
        engine.stop()
        os.environ.pop("SLURM_CONF", None)


def test_local_manager_docker_process_and_slurm_pool_at_once(slurm_settings):
    local = fiber.get_context("local")
    on_docker = fiber.get_context("docker")
    on_slurm = fiber.get_context("slurm", **slurm_settings)
    assert on_slurm.run_target().backend() is not on_docker.run_target().backend()
    with local.Manager() as manager:
        shared = manager.dict()
        p = on_docker.Process(target=_report, args=(shared, "docker"))
        p.start()
        with on_slurm.Pool(2) as pool:
            assert pool.map(_square, [(shared, x) for x in range(4)]) == [0, 1, 4, 9]
        p.join(300)
        assert p.exitcode == 0
        seen = dict(shared)
    assert seen["docker"][0] == "docker"
    assert {seen[f"slurm-{x}"][0] for x in range(4)} == {"slurm"}
    assert p.job_id is not None and not p.job_id.isdigit()  # a container id


def test_docker_process_resources_reach_the_host_config(engine_client):
    ctx = fiber.get_context("docker")
    p = ctx.Process(target=_hold, args=(30,), resources=fiber.Resources(
        cpu=0.5, memory="300M", extra={"docker": {"shm_size": "64m"}}))
    p.start()
    try:
        host_config = engine_client.api.inspect_container(p.job_id)["HostConfig"]
        assert host_config["NanoCpus"] == 500_000_000
        assert host_config["Memory"] == 300 * 1024 * 1024
        assert host_config["ShmSize"] == 64 * 1024 * 1024
    finally:
        p.terminate()
        p.join(60)


def test_docker_refuses_a_walltime_before_any_container(engine_client, run_labels):
    def ids():
        # the low-level listing: containers.list() inspects each container it lists,
        # and one removed meanwhile raises NotFound
        return {row["Id"] for row in engine_client.api.containers(all=True)}

    before = ids()
    with pytest.raises(ConfigError, match="docker backend cannot honour"):
        fiber.get_context("docker").Pool(2, resources={"walltime": "1:00:00"})
    assert ids() - before == set()  # none made (earlier ones may be removed meanwhile)
