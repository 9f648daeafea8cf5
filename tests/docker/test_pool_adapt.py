"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real docker test engine (up to 3: each worker a container), issue #28: a burst
runs on both, every task once, and after the idle timeout both are back at zero with
the containers gone, checked against the engine. The time from the map to the first
task that began in a container is printed (bench/results/adapt/first-task.md).
Nothing is faked."""

from __future__ import annotations

import time

import pytest
from adapt_burst import burst_and_back

from fiber.runtime.run import run_id
from fiber_docker.selfcontainer import own_container_id

pytestmark = pytest.mark.timeout(300)


def where(i: int) -> tuple[int, float, str | None]:
    """The task's number, when it began, and the container it ran in, as its mounts
    say (host networking: the hostname is the host's; the test may itself run in a
    container, whose id the local workers share with it)."""
    from fiber_docker.selfcontainer import own_container_id

    began = time.time()
    time.sleep(0.5)
    return i, began, own_container_id()


def test_a_burst_goes_from_local_to_docker_and_back(docker_engine, engine_client):
    """local max 2, then docker max 3: the map runs on both, each task once; the pool
    never holds more than each placement's maximum; after the idle timeout both are at
    zero, no container of the run is left (the engine's list), and the next map runs
    correctly (adapt_burst.burst_and_back)."""
    run = run_id()
    here = own_container_id()

    def containers() -> list[str]:
        # the low-level listing: containers.list() inspects each container it lists,
        # and one removed meanwhile raises NotFound (as in test_mixed_backends)
        return [row["Id"] for row in engine_client.api.containers(
            all=True, filters={"label": f"fiber.run={run}"})]

    burst_and_back("docker", 3, where, lambda box: box != here, containers,
                   "no container of the run left")
