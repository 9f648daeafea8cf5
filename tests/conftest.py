"""Root configuration of the project's own tests: every test runs on the backend that
``--fiber-backend NAME`` selects (default ``local``), whose real engine the repository's
``conftest.py`` starts for the session (fiber's pytest plugin, :mod:`fiber.testing.plugin`,
gives the option and the fixtures; with the option it also runs the suite it ships,
:mod:`fiber.testing.suite`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def fiber_engine(fiber_backend: dict[str, str]) -> dict[str, str]:
    """``{"backend": NAME, **the engine's FIBER_* settings}``, exported for the session."""
    return fiber_backend
