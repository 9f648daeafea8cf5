"""Backend ``faulty``: the real local backend with cluster faults injected in front.

Each fault is driven by an environment variable of the process that creates or polls
the jobs:

* ``FAULTY_CREATE_TRANSIENT=N``: the first N ``create_job`` calls of the process raise
  :class:`~fiber.backend.TransientBackendError` (as an API server's 503 would);
* ``FAULTY_CREATE_PERMANENT=1``: every ``create_job`` raises
  :class:`~fiber.backend.JobCreationError` (as a refused request would);
* ``FAULTY_CREATE_MISCONFIGURED=1``: every ``create_job`` raises
  :class:`~fiber.backend.ClusterUnreachableError` with ``transient=False`` (as a
  missing key file or kubeconfig would);
* ``FAULTY_POLL_OUTAGE=S``: ``poll`` raises
  :class:`~fiber.backend.ClusterUnreachableError` for S seconds from its first call;
* ``FAULTY_TERMINATE_DOWN=S``: ``terminate`` waits S seconds, then raises
  :class:`~fiber.backend.ClusterUnreachableError` (a cluster manager that does not
  answer: the job is not ended by the backend).

Everything else (and every call once the fault is over) is the local backend's own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from fiber.backend import (
    ClusterUnreachableError,
    Job,
    JobCreationError,
    JobSpec,
    JobStatus,
    TransientBackendError,
    hookimpl,
)
from fiber.backend.local.backend import LocalBackend

_lock = threading.Lock()
_creates = 0
_first_poll: float | None = None
#: how many create_job calls failed on purpose (read by in-process tests)
injected_create_failures = 0
injected_poll_failures = 0


class FaultyBackend(LocalBackend):
    name = "faulty"

    def create_job(self, spec: JobSpec) -> Job:
        global _creates, injected_create_failures
        if os.environ.get("FAULTY_CREATE_PERMANENT") == "1":
            raise JobCreationError("injected: the cluster refused the job (quota exceeded)")
        if os.environ.get("FAULTY_CREATE_MISCONFIGURED") == "1":
            raise ClusterUnreachableError("injected: the key file (setting x) does not exist",
                                          transient=False)
        with _lock:
            _creates += 1
            transient = _creates <= int(os.environ.get("FAULTY_CREATE_TRANSIENT", "0"))
            if transient:
                injected_create_failures += 1
        if transient:
            raise TransientBackendError("injected: the API server answered 503 Service "
                                        "Unavailable")
        return super().create_job(spec)

    def terminate(self, job: Job, force: bool = False) -> None:
        down = os.environ.get("FAULTY_TERMINATE_DOWN")
        if down is not None:
            time.sleep(float(down))
            raise ClusterUnreachableError("injected: the cluster manager does not answer")
        super().terminate(job, force)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        global _first_poll, injected_poll_failures
        outage = float(os.environ.get("FAULTY_POLL_OUTAGE", "0"))
        with _lock:
            if _first_poll is None:
                _first_poll = time.monotonic()
            failing = time.monotonic() - _first_poll < outage
            if failing:
                injected_poll_failures += 1
        if failing:
            raise ClusterUnreachableError("injected: cannot reach the cluster manager")
        return super().poll(jobs)


@hookimpl
def fiber_backends() -> dict[str, type[FaultyBackend]]:
    return {"faulty": FaultyBackend}
