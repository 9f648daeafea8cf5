"""The backend contract suite against the real SSH test hosts (two sshds in network
namespaces), then a check that no job process is left on them."""

from __future__ import annotations

import pytest

from fiber.testing.contract import BackendContract


class TestSSHContract(BackendContract):
    @pytest.fixture
    def backend(self, make_backend):
        return make_backend()

    @pytest.fixture
    def job_timeout(self) -> float:
        return 30.0
