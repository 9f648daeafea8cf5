"""The backend contract suite against the real SSH test hosts (two sshds in network
namespaces), then a check that no job process is left on them."""

from __future__ import annotations

import pytest

from fiber.testing.contract import BackendContract


class TestSSHContract(BackendContract):
    """Also run by the shipped suite (`--fiber-backend ssh`); the ssh backend declares
    ``list_jobs``: it searches its hosts for the jobs of other processes too."""

    @pytest.fixture
    def backend(self, make_backend):
        return make_backend()

    @pytest.fixture
    def job_timeout(self) -> float:
        return 30.0
