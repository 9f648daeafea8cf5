"""The suite's tests run on the session's backend (:func:`fiber.testing.plugin.fiber_backend`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _on_the_backend(fiber_backend: dict[str, str]) -> dict[str, str]:
    return fiber_backend
