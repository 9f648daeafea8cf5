"""The backend contract (:class:`fiber.testing.contract.BackendContract`) against the
session's backend, built from the effective fiber settings (the test cluster's)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from fiber.backend import Backend, JobSpec, registry
from fiber.runtime import config
from fiber.testing.contract import BackendContract


class TestBackendContract(BackendContract):
    @pytest.fixture
    def backend(self, fiber_backend: dict[str, str]) -> Iterator[Backend]:
        settings = config.load({}).as_dict()
        backend = registry.get_backend(fiber_backend["backend"], settings)
        yield backend

    @pytest.fixture
    def python(self) -> str:
        return str(config.load({}).as_dict()["python"] or sys.executable)

    @pytest.fixture
    def base_spec(self) -> JobSpec:
        return JobSpec(command=[], image=config.load({}).as_dict().get("image"))

    @pytest.fixture
    def job_timeout(self) -> float:
        return 120.0
