"""The job monitor: one thread per backend that watches the statuses of live jobs.

Every :attr:`Backend.poll_interval` seconds (or at once when woken, e.g. because a
child's connection dropped) it asks the backend for the statuses of all watched jobs in
one :meth:`Backend.poll` call and calls each finished job's callback once, from the
monitor's thread. With many jobs it polls less often (:func:`poll_pause`: about
:data:`STATUSES_PER_SECOND` statuses a second): at 10,000 jobs a poll a second was a
tenth of a core of the parent's (issue #29); a connected job's end is seen at once by
its dropped connection (which wakes the monitor), so the pause delays only the end of
jobs that never connected.

A job whose process is connected to its parent is *quiet* (:meth:`JobMonitor.quiet`,
from when it says hello until its connection drops or its heartbeat times out:
:meth:`JobMonitor.resume`): its end is seen by its connection, so a poll asks for all
the jobs that have not connected (or whose connection is gone) but only for the next
:data:`QUIET_SLICE` quiet ones, in turn; each poll, and each start, cost the number of
live jobs before (issue #29). With up to :data:`QUIET_SLICE` jobs connected every poll
still asks for all of them; with more, each is asked about every few polls (the
cluster's word on a connected job matters only when it is final: a ``LOST`` for a job
with a fresh heartbeat is overruled, see :mod:`fiber.runtime.popen`).
A new job does not wake the monitor (it did: a poll of every job at each start) unless
no job was polled; it is first polled within the pause, which bounds how late the death
of a job that never connects is seen (as it did for every poll after the first).

A poll that fails (the cluster manager is down, overloaded or cut off) is not the end
of any job: the jobs stay watched with their last known state, and the monitor keeps
polling, backing off to :data:`LONGEST_OUTAGE_PAUSE` between tries, until the cluster
answers again. An outage is logged once: a warning when the first poll fails, an info
line when a poll works again (each failed poll's traceback only at debug level). Jobs
that end meanwhile are seen at the next poll that works; a job that is connected to its
parent is also seen to end by its dropped connection, without any poll.

A monitor whose thread dies (:mod:`fiber.threads`) calls every watched job's callback,
and that of every job watched later, once with a ``LOST`` status whose reason names the
thread and its error: a connected job is kept (its connection tells its end), a job
that has not connected fails to start with that reason instead of waiting for ever.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from collections.abc import Callable

from fiber import threads
from fiber.backend import Backend
from fiber.backend.job import Job, JobState, JobStatus
from fiber.runtime.per_backend import PerBackend

logger = logging.getLogger("fiber")

Callback = Callable[[JobStatus], None]

#: the longest pause between two polls while polls fail, seconds
LONGEST_OUTAGE_PAUSE = 10.0
#: job statuses a monitor asks for a second, about (more jobs: longer pauses)
STATUSES_PER_SECOND = 2000.0
#: the longest pause between two polls that work, seconds
LONGEST_POLL_PAUSE = 5.0
#: connected (quiet) jobs a poll asks about, at most, in turn
QUIET_SLICE = 256


def poll_pause(interval: float, jobs: int) -> float:
    """Seconds between two polls of ``jobs`` jobs: the backend's ``interval``, longer
    when that would ask for more than :data:`STATUSES_PER_SECOND` statuses a second, at
    most :data:`LONGEST_POLL_PAUSE` (or ``interval`` if longer)."""
    return max(interval, min(LONGEST_POLL_PAUSE, jobs / STATUSES_PER_SECOND))


class JobMonitor:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._jobs: dict[str, tuple[Job, Callback]] = {}
        # the watched jobs polled each time: all but the quiet (connected) ones, which
        # are polled QUIET_SLICE at a time, in turn (the one asked about last at the end)
        self._polled: dict[str, Job] = {}
        self._quiet: collections.OrderedDict[str, Job] = collections.OrderedDict()
        #: when the current outage began (time.monotonic()), None while polls work
        self.outage_since: float | None = None
        #: when the poll under way began (None between polls)
        self.polling_since: float | None = None
        #: when another call last found the cluster manager unreachable (see
        #: :func:`note_unreachable`; None: never)
        self.unreachable_at: float | None = None
        #: the statuses of the last poll that worked (for inspection: ``fiber top``)
        self.last: dict[str, JobStatus] = {}
        self._cond = threading.Condition()
        #: the status every job gets once the thread has died (None while it runs)
        self._dead: JobStatus | None = None
        self._failed: set[str] = set()  # ids of jobs told so already
        self._thread = threads.start("fiber-monitor", self._run,
                                     name=f"fiber-monitor-{backend.name}", fails=self._died)

    def watch(self, job: Job, callback: Callback, quiet: bool = False) -> None:
        """Call ``callback(status)`` once the job's status is final; ``quiet``: it is
        connected, not polled until :meth:`resume`."""
        with self._cond:
            self._jobs[job.id] = (job, callback)
            if quiet:
                self._polled.pop(job.id, None)
                self._quiet[job.id] = job
            else:
                self._quiet.pop(job.id, None)
                if not self._polled:
                    self._cond.notify()  # (the monitor waits for a job to poll)
                self._polled[job.id] = job
            dead = self._dead
            if dead is None or job.id in self._failed:
                return
            self._failed.add(job.id)
        callback(dead)

    def _died(self, error: BaseException) -> None:
        with self._cond:
            self._dead = JobStatus(JobState.LOST, reason=str(error))
            entries = [entry for job_id, entry in self._jobs.items()
                       if job_id not in self._failed]
            self._failed.update(job.id for job, _ in entries)
        for _, callback in entries:
            try:
                callback(self._dead)
            except Exception:  # noqa: BLE001
                logger.exception("job callback failed")

    def unwatch(self, job: Job) -> None:
        with self._cond:
            self._jobs.pop(job.id, None)
            self._polled.pop(job.id, None)
            self._quiet.pop(job.id, None)

    def quiet(self, job: Job) -> None:
        """Poll a watched job only in turn with the other quiet ones (at most
        :data:`QUIET_SLICE` a poll): it is connected, its end is seen by its connection
        (until :meth:`resume`)."""
        with self._cond:
            if self._polled.pop(job.id, None) is not None:
                self._quiet[job.id] = job

    def resume(self, job: Job) -> None:
        """Poll a watched job again (it was quiet: its connection dropped, or its
        heartbeat stopped), from the next poll on."""
        with self._cond:
            if job.id in self._jobs:
                self._quiet.pop(job.id, None)
                if not self._polled:
                    self._cond.notify()  # (the monitor waits for a job to poll)
                self._polled[job.id] = job

    def wake(self, job: Job | None = None) -> None:
        """Poll now; ``job`` (watched) is polled again (:meth:`resume`)."""
        if job is not None:
            self.resume(job)
        with self._cond:
            self._cond.notify()

    def _quiet_slice(self) -> list[Job]:
        """The next :data:`QUIET_SLICE` quiet jobs, moved to the end (under the lock)."""
        jobs = list(itertools.islice(self._quiet.values(), QUIET_SLICE))
        if len(jobs) < len(self._quiet):
            for job in jobs:
                self._quiet.move_to_end(job.id)
        return jobs

    def _run(self) -> None:
        interval = max(0.01, float(self.backend.poll_interval))
        pause = interval
        while True:
            with self._cond:
                while not self._polled and not self._quiet:
                    self._cond.wait()
                self._cond.wait(pause)
                jobs = list(self._polled.values()) + self._quiet_slice()
            if not jobs:
                continue
            self.polling_since = time.monotonic()
            try:
                statuses = self.backend.poll(jobs)
            except Exception as exc:  # noqa: BLE001 - keep watching; the cluster may come back
                if self.outage_since is None:
                    self.outage_since = time.monotonic()
                    logger.warning(
                        "cannot read the status of %d %s jobs (%s: %s); fiber keeps "
                        "polling, and takes no job for lost meanwhile", len(jobs),
                        self.backend.name, type(exc).__name__, exc)
                logger.debug("polling %d %s jobs failed", len(jobs), self.backend.name,
                             exc_info=True)
                pause = min(pause * 2, max(interval, LONGEST_OUTAGE_PAUSE))
                continue
            finally:
                self.polling_since = None
            if self.outage_since is not None:
                logger.info("the status of %s jobs can be read again (after %.1f s)",
                            self.backend.name, time.monotonic() - self.outage_since)
                self.outage_since = None
            pause = poll_pause(interval, len(jobs))
            self.last = statuses
            for job_id, status in statuses.items():
                if not status.is_final:
                    continue
                with self._cond:
                    entry = self._jobs.pop(job_id, None)
                    self._polled.pop(job_id, None)
                    self._quiet.pop(job_id, None)
                if entry is None:
                    continue
                try:
                    entry[1](status)
                except Exception:  # noqa: BLE001
                    logger.exception("job %s callback failed", job_id)


#: each backend's monitor in this process
monitor_for: PerBackend[JobMonitor] = PerBackend(JobMonitor)


#: a poll that has not returned after this many seconds counts as an outage
SLOW_POLL = 2.0


def in_outage(backend: Backend) -> bool:
    """Whether the cluster manager of ``backend`` does not answer now: its last
    status poll failed, the one under way has taken more than :data:`SLOW_POLL`
    seconds, another call found it unreachable (:func:`note_unreachable`), or the
    monitor's thread died (no status will come)."""
    mon = monitor_for.get(backend)
    if mon is None:
        return False
    since = mon.polling_since
    now = time.monotonic()
    return mon.outage_since is not None or mon._dead is not None or (
        since is not None and now - since > SLOW_POLL) or (
        mon.unreachable_at is not None and now - mon.unreachable_at < UNREACHABLE_FOR)


#: seconds a call's ClusterUnreachableError counts as an outage (see note_unreachable)
UNREACHABLE_FOR = 5.0


def note_unreachable(backend: Backend) -> None:
    """A call to ``backend`` other than a poll (ending jobs) found its cluster manager
    unreachable: :func:`in_outage` says so for :data:`UNREACHABLE_FOR` seconds, so that
    the waits at exit stop early without waiting for a poll to fail too (connected jobs
    are polled seldom: with many, or when the monitor's thread is slow to run)."""
    mon = monitor_for.get(backend)
    if mon is not None:
        mon.unreachable_at = time.monotonic()


def last_state(job_id: str) -> JobState | None:
    """The state the last poll that worked saw for the job ``job_id`` (any backend's
    monitor), None when none has seen it yet."""
    for mon in monitor_for.made():
        status = mon.last.get(job_id)
        if status is not None:
            return status.state
    return None
