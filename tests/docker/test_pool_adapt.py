"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real docker test engine (up to 3: each worker a container), issue #28: a burst
runs on both, every task once, and after the idle timeout both are back at zero with
the containers gone, checked against the engine. The time from the map to the first
task that began in a container is printed (bench/results/adapt/first-task.md).
Nothing is faked."""

from __future__ import annotations

import time

import pytest

import fiber
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


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def held(pool) -> list[int]:
    return [p.busy + p.idle + p.starting + p.pending
            for p in pool.stats().adapt.placements]


def test_a_burst_goes_from_local_to_docker_and_back(docker_engine, engine_client):
    """local max 2, then docker max 3: the map runs on both, each task once; the pool
    never holds more than each placement's maximum; after the idle timeout both are at
    zero, no container of the run is left (the engine's list), and the next map runs
    correctly."""
    run = run_id()

    def containers() -> list[str]:
        return [c.name for c in engine_client.containers.list(
            all=True, filters={"label": f"fiber.run={run}"})]

    local, docker = fiber.get_context("local"), fiber.get_context("docker")
    pool = fiber.Pool(1, context=local)
    n = 80
    try:
        pool.adapt(0, placements=[(local, 2), (docker, 3)], idle_timeout=2.0)
        started = time.time()
        result = pool.map_async(where, range(n), chunksize=1)
        most = [0, 0]
        while not result.ready():
            counts = held(pool)
            most = [max(m, c) for m, c in zip(most, counts, strict=True)]
            time.sleep(0.1)
        out = result.get()
        took = time.time() - started
        assert [i for i, _, _ in out] == list(range(n))
        assert most[0] <= 2 and most[1] <= 3, most
        here = own_container_id()
        inside = [began for _, began, box in out if box != here]
        on_local = [began for _, began, box in out if box == here]
        assert inside and on_local, (len(inside), len(on_local))
        first = min(inside) - started
        print(f"adaptive pool local 2 + docker 3, {n} tasks of 0.5 s: {took:.1f} s; "
              f"{len(inside)} in containers; first task in a container {first:.2f} s "
              "after the map")
        wait_for(lambda: held(pool) == [0, 0], 60, "both placements at zero")
        wait_for(lambda: not containers(), 60, "no container of the run left")
        assert pool.map(abs, range(-3, 3)) == [3, 2, 1, 0, 1, 2]
    finally:
        pool.terminate()
        pool.join()
    wait_for(lambda: not containers(), 90, "no container of the run left")
