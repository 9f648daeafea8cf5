"""Runs after the other docker tests (file order): nothing they created is left on
the engine. (At the end of the session tests/engines/docker.py's stop() checks the
same for every test, the portable ones included, and fails the session otherwise.)"""

from __future__ import annotations

import time


def test_no_fiber_containers_are_left(engine_client):
    deadline = time.monotonic() + 30
    while True:
        rows = engine_client.api.containers(all=True, filters={"label": "fiber.run"})
        if not rows or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert [(row["Names"], row["Labels"].get("fiber.run"), row["State"]) for row in rows] == []
