"""The backend contract suite against the real test cluster."""

from __future__ import annotations

import pytest

from fiber.testing.contract import BackendContract


class TestKubernetesContract(BackendContract):
    @pytest.fixture
    def backend(self, make_backend):
        return make_backend()

    @pytest.fixture
    def job_timeout(self) -> float:
        return 90.0
