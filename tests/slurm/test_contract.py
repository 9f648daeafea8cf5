"""The backend contract suite against the real one-node Slurm test cluster, plus a
check that the cluster holds no live job of the suite's run afterwards."""

from __future__ import annotations

import pytest

from fiber.testing.contract import BackendContract
from fiber_slurm import script


class TestSlurmContract(BackendContract):
    @pytest.fixture
    def job_timeout(self) -> float:
        return 60.0

    @pytest.fixture(autouse=True)
    def nothing_left(self, backend, run_labels, squeue_live):
        yield
        assert squeue_live(script.job_name(run_labels)) == []
