"""The shipped backend contract holds a backend that does not declare the optional
``logs`` capability to the rest of the contract and skips only what needs logs
(docs/writing-a-backend.md). The backend here is the real local backend with ``logs``
withdrawn: it declares only ``list_jobs`` and its ``logs()`` is the base class's (says
nothing), as a backend without logs has; its jobs are real local jobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fiber.backend import Backend, Job
from fiber.backend.local.backend import LocalBackend
from fiber.testing.contract import BackendContract


class NoLogsBackend(LocalBackend):
    """The local backend without the ``logs`` capability."""

    capabilities = frozenset({"list_jobs"})

    def logs(self, job: Job) -> str:
        return Backend.logs(self, job)


class TestContractWithoutLogs(BackendContract):
    @pytest.fixture
    def backend(self) -> Iterator[Backend]:
        backend = NoLogsBackend({"local_start_method": "spawn"})
        yield backend
        backend.close()

