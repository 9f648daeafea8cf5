"""Creating jobs in bulk: the requests that arrive together become one
:meth:`Backend.create_jobs` call.

Each fiber process creates its own job (:class:`fiber.runtime.popen.JobPopen`, on the
thread that starts it), and a pool starts its workers from several threads at once. For
a backend that declares the ``bulk`` capability (it creates many jobs in one request: a
Slurm job array), :func:`create` gathers the creations that arrive together into one
``create_jobs`` call and hands each requester its own :class:`Job`, or the exception its
spec's creation raised: so each process keeps its own retry of transient errors
(:mod:`fiber.runtime.retry`), its own error message and its own clean-up.

Gathering: the first requester while no call is in flight *leads*: it waits until no
new request has come for :data:`GATHER` seconds (:data:`EXPECT_WAIT` while a pool has
announced more, :func:`expect`), takes every request waiting and makes the call.
Requests that arrive meanwhile wait; when the call returns, one of them leads the next
call, with all of them. No thread of its own: a creation blocks only its own caller.

A backend without ``bulk`` is called as before, ``create_job`` per process, from the
requester's thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from fiber.backend.base import Backend
from fiber.backend.job import Job, JobSpec
from fiber.errors import BackendError
from fiber.runtime.per_backend import PerBackend

#: seconds without a new request that end a gathering (nothing announced)
GATHER = 0.005
#: seconds without a new request that end a gathering while more are announced
EXPECT_WAIT = 0.5
#: threads a pool may start workers from at once on a ``bulk`` backend (each blocks
#: while its request waits for the group's call)
BULK_STARTERS = 256


def is_bulk(backend: Backend) -> bool:
    """Whether ``backend`` creates many jobs in one request (declares ``bulk``)."""
    return "bulk" in backend.capabilities


def starter_threads(backend: Backend, default: int) -> int:
    """How many threads a pool should start workers from on ``backend``: enough for
    a whole group to reach the same call on a ``bulk`` backend, ``default`` on others."""
    return max(default, BULK_STARTERS) if is_bulk(backend) else default


class _Request:
    __slots__ = ("spec", "outcome", "done", "lead")

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.outcome: Job | BaseException | None = None
        self.done = False
        self.lead = False  # it leads the next call

    def result(self) -> Job:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        assert isinstance(self.outcome, Job)
        return self.outcome


class Submitter:
    """The gathering of one backend's creations (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._leading = False
        self._expected = 0
        self._last_arrival = 0.0
        #: sizes of the create_jobs calls made (for tests and logs)
        self.calls: list[int] = []

    def expect(self, count: int) -> None:
        """``count`` creations are on their way (a pool's group): a gathering waits
        for them, up to :data:`EXPECT_WAIT` seconds after the last arrival."""
        with self._cond:
            self._expected += max(0, count)
            self._cond.notify_all()

    def create(self, spec: JobSpec) -> Job:
        """``spec``'s job, created with the others that arrive together."""
        request = _Request(spec)
        with self._cond:
            self._pending.append(request)
            self._expected = max(0, self._expected - 1)
            self._last_arrival = time.monotonic()
            self._cond.notify_all()
            if self._leading:
                while not request.done and not request.lead:
                    self._cond.wait()
                if request.done:
                    return request.result()
            self._leading = True
        self._lead()
        return request.result()

    def _gather(self) -> list[_Request]:
        with self._cond:
            while True:
                limit = EXPECT_WAIT if self._expected > 0 else GATHER
                quiet = time.monotonic() - self._last_arrival
                if quiet >= limit:
                    break
                self._cond.wait(limit - quiet)
            batch, self._pending = self._pending, []
            self._expected = 0  # (those announced and not come by now come late, alone)
            return batch

    def _lead(self) -> None:
        """Make one call with every request waiting, then hand the lead on."""
        batch: list[_Request] = []
        try:
            batch = self._gather()
            outcomes = self._call([r.spec for r in batch])
        except BaseException as exc:  # noqa: BLE001 - each requester raises it
            outcomes = [exc] * len(batch)
        with self._cond:
            for request, outcome in zip(batch, outcomes, strict=True):
                request.outcome = outcome
                request.done = True
            if self._pending:
                self._pending[0].lead = True
            else:
                self._leading = False
            self._cond.notify_all()

    def _call(self, specs: Sequence[JobSpec]) -> list[Job | BaseException]:
        self.calls.append(len(specs))
        outcomes = self.backend.create_jobs(specs)
        if len(outcomes) != len(specs):
            raise BackendError(
                f"the {self.backend.name} backend's create_jobs returned {len(outcomes)} "
                f"outcomes for {len(specs)} job specs (one per spec, in order, is the "
                "contract)", transient=False)
        return list(outcomes)


#: the submitter of each backend in this process (a child forked from this process
#: makes its own: the threads of these did not cross the fork)
submitter: PerBackend[Submitter] = PerBackend(Submitter, forget_after_fork=True)


def create(backend: Backend, spec: JobSpec) -> Job:
    """Create ``spec``'s job on ``backend``: gathered with others on a ``bulk``
    backend, ``create_job`` alone on any other."""
    if not is_bulk(backend):
        return backend.create_job(spec)
    return submitter(backend).create(spec)


def expect(backend: Backend, count: int) -> None:
    """``count`` creations on ``backend`` are on their way (a pool's group of
    workers): a ``bulk`` backend's gathering waits for them. Nothing for others."""
    if count > 1 and is_bulk(backend):
        submitter(backend).expect(count)
