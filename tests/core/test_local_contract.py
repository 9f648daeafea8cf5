"""The backend contract suite run against the built-in local backend."""

import pytest

from fiber.backend.local.backend import LocalBackend
from fiber.testing.contract import BackendContract


class TestLocalBackendContract(BackendContract):
    @pytest.fixture
    def backend(self):
        backend = LocalBackend({})
        yield backend
        backend.close()
