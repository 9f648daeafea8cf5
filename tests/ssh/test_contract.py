"""The backend contract suite against the real SSH test hosts (two sshds in network
namespaces), then a check that no job process is left on them."""

from __future__ import annotations

import pytest

from fiber.testing.contract import BackendContract


class TestSSHContract(BackendContract):
    """Also run by the shipped suite (`--fiber-backend ssh`); here the list-and-release
    test runs too: the ssh backend does not declare ``list_jobs`` (it cannot search its
    hosts for other processes' jobs), but the jobs of one instance it does list."""

    @pytest.fixture
    def backend(self, make_backend):
        return make_backend()

    @pytest.fixture
    def cluster_job_ids(self, backend, run_labels):
        return lambda: {job.id for job in backend.list_jobs(run_labels)}

    @pytest.fixture
    def job_timeout(self) -> float:
        return 30.0
