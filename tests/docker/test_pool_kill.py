"""fiber.Pool on the docker backend: `docker kill` of one worker's container in the
middle of a map loses nothing (the pool requeues the worker's tasks and replaces it),
and every container of the pool is gone afterwards. Real engine, real containers."""

from __future__ import annotations

import time

import pytest

import fiber
import fiber.runtime.run


def slow_square(x: int) -> int:
    time.sleep(0.005)
    return x * x


def _running_workers(engine_client) -> list[dict]:
    """Running pool worker containers of this run (other tests' runs may still be
    ending their own)."""
    rows = engine_client.api.containers(filters={
        "label": f"fiber.run={fiber.runtime.run.run_id()}", "status": "running"})
    return [row for row in rows if "poolworker" in row["Labels"].get("fiber.name", "")]


def test_docker_kill_of_a_worker_mid_map_loses_nothing(engine_client):
    if not hasattr(fiber, "Pool"):
        pytest.skip("fiber.Pool is not in the core yet")
    n = 2000
    with fiber.Pool(3) as pool:
        assert pool.map(slow_square, range(3)) == [0, 1, 4]  # workers are up
        result = pool.map_async(slow_square, range(n), chunksize=1)
        deadline = time.monotonic() + 120
        while len(_running_workers(engine_client)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = _running_workers(engine_client)
        assert workers, "no running pool worker container to kill"
        victim = workers[0]
        assert victim["Labels"]["fiber.run"] == fiber.runtime.run.run_id()
        time.sleep(0.3)
        assert not result.ready(), "the map ended before the kill: make it longer"
        engine_client.api.kill(victim["Id"])  # what `docker kill <container>` does
        assert result.get(300) == [x * x for x in range(n)]
        state = engine_client.api.inspect_container(victim["Id"])["State"] \
            if engine_client.api.containers(all=True, filters={"id": victim["Id"]}) else None
        assert state is None or state["ExitCode"] == 137
    pool.join()
    deadline = time.monotonic() + 30
    while engine_client.api.containers(all=True, filters={
            "label": f"fiber.run={fiber.runtime.run.run_id()}"}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_client.api.containers(all=True, filters={
        "label": f"fiber.run={fiber.runtime.run.run_id()}"}) == []
