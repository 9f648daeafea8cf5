"""The job monitor: one thread per backend that watches the statuses of live jobs.

Every :attr:`Backend.poll_interval` seconds (or at once when woken, e.g. because a
child's connection dropped) it asks the backend for the statuses of all watched jobs in
one :meth:`Backend.poll` call and calls each finished job's callback once, from the
monitor's thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fiber.backend import Backend
from fiber.backend.job import Job, JobStatus

logger = logging.getLogger("fiber")

Callback = Callable[[JobStatus], None]


class JobMonitor:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._jobs: dict[str, tuple[Job, Callback]] = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"fiber-monitor-{backend.name}",
                                        daemon=True)
        self._thread.start()

    def watch(self, job: Job, callback: Callback) -> None:
        with self._cond:
            self._jobs[job.id] = (job, callback)
            self._cond.notify()

    def unwatch(self, job: Job) -> None:
        with self._cond:
            self._jobs.pop(job.id, None)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def _run(self) -> None:
        interval = max(0.01, float(self.backend.poll_interval))
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                self._cond.wait(interval)
                jobs = [job for job, _ in self._jobs.values()]
            try:
                statuses = self.backend.poll(jobs)
            except Exception:  # noqa: BLE001 - keep watching; the cluster may come back
                logger.warning("polling %d %s jobs failed", len(jobs), self.backend.name,
                               exc_info=True)
                continue
            for job_id, status in statuses.items():
                if not status.is_final:
                    continue
                with self._cond:
                    entry = self._jobs.pop(job_id, None)
                if entry is None:
                    continue
                try:
                    entry[1](status)
                except Exception:  # noqa: BLE001
                    logger.exception("job %s callback failed", job_id)


_monitors: dict[int, JobMonitor] = {}
_lock = threading.Lock()


def monitor_for(backend: Backend) -> JobMonitor:
    with _lock:
        mon = _monitors.get(id(backend))
        if mon is None or mon.backend is not backend:
            mon = _monitors[id(backend)] = JobMonitor(backend)
        return mon
