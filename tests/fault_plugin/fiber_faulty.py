"""Backend ``faulty``: the real local backend with cluster faults injected in front.

Each fault is driven by an environment variable of the process that creates or polls
the jobs:

* ``FAULTY_CREATE_TRANSIENT=N``: the first N ``create_job`` calls of the process raise
  :class:`~fiber.backend.TransientBackendError` (as an API server's 503 would);
* ``FAULTY_CREATE_PERMANENT=1``: every ``create_job`` raises
  :class:`~fiber.backend.JobCreationError` (as a refused request would);
* ``FAULTY_CREATE_PERMANENT_AFTER=N``: the first N ``create_job`` calls of the process
  create their jobs, every later one raises :class:`~fiber.backend.JobCreationError`
  (a quota reached part way through a pool's start; with ``FAULTY_START_DELAY`` the
  refusal comes when the job would have arrived);
* ``FAULTY_REFUSE_WHEN=PATH``: a call refused by ``FAULTY_CREATE_PERMANENT_AFTER``
  raises only once the file PATH exists (at most 60 s): the refusal comes when the test
  (or a job of it) says, not at a time that a loaded machine may reach first;
* ``FAULTY_CREATE_MISCONFIGURED=1``: every ``create_job`` raises
  :class:`~fiber.backend.ClusterUnreachableError` with ``transient=False`` (as a
  missing key file or kubeconfig would);
* ``FAULTY_POLL_OUTAGE=S``: ``poll`` raises
  :class:`~fiber.backend.ClusterUnreachableError` for S seconds from its first call;
* ``FAULTY_POLL_FORGETS_AT=S``: S seconds after the first ``poll``, the cluster
  forgets every job created until then: ``poll`` says they are LOST (a cluster
  manager restarted with its state wiped, which no longer knows the jobs that ran
  before); later jobs are reported as they are;
* ``FAULTY_POLL_INTERVAL=S``: the backend's ``poll_interval`` is S seconds (a
  monitor that polls seldom: its first poll comes S seconds after a job starts);
* ``FAULTY_TERMINATE_DOWN=S``: ``terminate`` waits S seconds, then raises
  :class:`~fiber.backend.ClusterUnreachableError` (a cluster manager that does not
  answer: the job is not ended by the backend).
* ``FAULTY_CANCEL_PLAIN=1``: ``terminate`` ends the job with SIGTERM even when asked
  for SIGKILL (a batch scheduler cancelling a job whose batch step has not launched
  yet ends it its own way: Slurm's plain cancel is SIGTERM);
* ``FAULTY_START_DELAY=S``: jobs arrive one by one, S seconds apart: the k-th
  ``create_job`` of the process (k from 0) returns no earlier than k * S seconds after
  the first began (as a cluster grants jobs over time; the worker counts as starting
  meanwhile). The pool starts jobs on several threads, so the delays overlap.

Everything else (and every call once the fault is over) is the local backend's own.

Backend ``faulty_bulk`` is the same with the ``bulk`` capability: its ``create_jobs``
creates a group's jobs one after the other in one call (as a job array would be one
request), records each call's size (``bulk_calls``; appended as a line to the file
``FAULTY_BULK_CALLS_FILE`` names, for tests that run a program), and refuses for good
(:class:`~fiber.backend.JobCreationError`) each spec whose environment holds
``FAULTY_REFUSE=1``, while the others of its call are created.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from fiber.backend import (
    ClusterUnreachableError,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
    Plugin,
    TransientBackendError,
)
from fiber.backend.local.backend import LocalBackend

_lock = threading.Lock()
_creates = 0
_first_poll: float | None = None
#: how many create_job calls failed on purpose (read by in-process tests)
injected_create_failures = 0
injected_poll_failures = 0
_created: dict[str, float] = {}  # job id -> when create_job returned it
_first_create: float | None = None
_delayed = 0  # create_job calls given an arrival time so far


class FaultyBackend(LocalBackend):
    name = "faulty"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "FAULTY_POLL_INTERVAL" in os.environ:
            self.poll_interval = float(os.environ["FAULTY_POLL_INTERVAL"])

    def create_job(self, spec: JobSpec) -> Job:
        global _creates, injected_create_failures, _first_create, _delayed
        if os.environ.get("FAULTY_CREATE_PERMANENT") == "1":
            raise JobCreationError("injected: the cluster refused the job (quota exceeded)")
        if os.environ.get("FAULTY_CREATE_MISCONFIGURED") == "1":
            raise ClusterUnreachableError("injected: the key file (setting x) does not exist",
                                          transient=False)
        with _lock:
            _creates += 1
            refused = _creates > int(os.environ.get("FAULTY_CREATE_PERMANENT_AFTER", "-1")) >= 0
            transient = _creates <= int(os.environ.get("FAULTY_CREATE_TRANSIENT", "0"))
            if transient:
                injected_create_failures += 1
        if transient:
            raise TransientBackendError("injected: the API server answered 503 Service "
                                        "Unavailable")
        delay = float(os.environ.get("FAULTY_START_DELAY", "0"))
        if delay > 0:
            with _lock:
                if _first_create is None:
                    _first_create = time.monotonic()
                arrival = _first_create + _delayed * delay
                _delayed += 1
            time.sleep(max(0.0, arrival - time.monotonic()))
        gate = os.environ.get("FAULTY_REFUSE_WHEN")
        if refused and gate:
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
        if refused:
            raise JobCreationError("injected: the cluster refused the job (quota reached "
                                   "after the first jobs)")
        job = super().create_job(spec)
        _created[job.id] = time.monotonic()
        return job

    def terminate(self, job: Job, force: bool = False) -> None:
        down = os.environ.get("FAULTY_TERMINATE_DOWN")
        if down is not None:
            time.sleep(float(down))
            raise ClusterUnreachableError("injected: the cluster manager does not answer")
        if os.environ.get("FAULTY_CANCEL_PLAIN") == "1":
            force = False
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
        forget = os.environ.get("FAULTY_POLL_FORGETS_AT")
        if forget is not None and time.monotonic() - _first_poll >= float(forget):
            wiped = _first_poll + float(forget)
            statuses = super().poll(jobs)
            for job in jobs:
                if _created.get(job.id, wiped) < wiped:
                    statuses[job.id] = JobStatus(JobState.LOST, reason="injected: no such job")
            return statuses
        return super().poll(jobs)


#: the sizes of faulty_bulk's create_jobs calls in this process
bulk_calls: list[int] = []


class FaultyBulkBackend(FaultyBackend):
    name = "faulty_bulk"
    capabilities = frozenset({"logs", "list_jobs", "bulk"})

    def create_jobs(self, specs: Sequence[JobSpec]) -> list[Job | BaseException]:
        with _lock:
            bulk_calls.append(len(specs))
            record = os.environ.get("FAULTY_BULK_CALLS_FILE")
            if record:
                with open(record, "a") as calls:
                    calls.write(f"{len(specs)}\n")
        outcomes: list[Job | BaseException] = []
        for spec in specs:
            try:
                if spec.env.get("FAULTY_REFUSE") == "1":
                    raise JobCreationError(f"injected: job {spec.name} refused")
                outcomes.append(self.create_job(spec))
            except Exception as exc:  # noqa: BLE001 - the outcome of this spec
                outcomes.append(exc)
        return outcomes


plugin = Plugin(
    package="fiber-faulty",
    contract=1,
    backends={"faulty": "fiber_faulty:FaultyBackend",
              "faulty_bulk": "fiber_faulty:FaultyBulkBackend"},
)
