"""The backend contract suite against the real test engine and the test image (this
Python and its virtual environment at the same paths)."""

from __future__ import annotations

from fiber.testing.contract import BackendContract


class TestDockerContract(BackendContract):
    """Every contract test; ``backend`` comes from tests/docker/conftest.py."""
