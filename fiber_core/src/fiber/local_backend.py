"""The built-in ``local`` backend: every job is a subprocess of this machine.

It registers through the same ``fiber_backends`` hook as any third-party backend
(entry point ``local`` in the ``fiber`` group of fiber-core's metadata). Each job runs
in its own session (so terminate reaches the whole process group); its stdout and
stderr go to a log file that :meth:`LocalBackend.logs` reads and
:meth:`LocalBackend.release` deletes. cpu, memory and gpu requests are not enforced
on this backend (they are logged at debug level).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fiber.backend import Backend, JobCreationError
from fiber.hookspecs import hookimpl
from fiber.job import Job, JobSpec, JobState, JobStatus

logger = logging.getLogger("fiber")


class LocalBackend(Backend):
    """Jobs as subprocesses of this process."""

    name = "local"
    poll_interval = 0.2

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._logdir: str | None = None

    def _log_path(self, name: str) -> str:
        with self._lock:
            if self._logdir is None:
                self._logdir = tempfile.mkdtemp(prefix="fiber-local-logs-")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return tempfile.mktemp(prefix=safe + "-", suffix=".log", dir=self._logdir)

    def create_job(self, spec: JobSpec) -> Job:
        if spec.cpu or spec.memory or spec.gpu:
            logger.debug("local backend does not enforce cpu/memory/gpu requests of %s", spec.name)
        env = dict(os.environ)
        env.update(spec.env)
        log_path = self._log_path(spec.name)
        try:
            with open(log_path, "wb") as log:
                popen = subprocess.Popen(
                    spec.command,
                    env=env,
                    cwd=spec.cwd or None,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            raise JobCreationError(
                f"cannot start {spec.command[0]!r} for job {spec.name}: {exc.strerror or exc}"
            ) from exc
        job = Job(id=str(popen.pid), backend=self.name, spec=spec, host="localhost",
                  handle=(popen, log_path))
        with self._lock:
            self._jobs[job.id] = job
        return job

    @staticmethod
    def _to_status(returncode: int | None, cancelled: bool = False) -> JobStatus:
        if returncode is None:
            return JobStatus(JobState.RUNNING)
        if returncode == 0:
            return JobStatus(JobState.SUCCEEDED, 0)
        if cancelled:
            return JobStatus(JobState.CANCELLED, returncode)
        reason = None
        if returncode < 0:
            try:
                reason = signal.Signals(-returncode).name
            except ValueError:
                reason = f"signal {-returncode}"
        return JobStatus(JobState.FAILED, returncode, reason)

    def status(self, job: Job) -> JobStatus:
        popen, _ = job.handle
        return self._to_status(popen.poll(), getattr(popen, "_fiber_cancelled", False))

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        return {job.id: self.status(job) for job in jobs}

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        popen, _ = job.handle
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.status(job)

    def terminate(self, job: Job, force: bool = False) -> None:
        popen, _ = job.handle
        if popen.poll() is not None:
            return
        popen._fiber_cancelled = True
        sig = signal.SIGKILL if force else signal.SIGTERM
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            popen.send_signal(sig)

    def logs(self, job: Job) -> str:
        _, log_path = job.handle
        try:
            with open(log_path, "rb") as log:
                return log.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def release(self, job: Job) -> None:
        popen, log_path = job.handle
        if popen.poll() is None:
            return
        with self._lock:
            self._jobs.pop(job.id, None)
        try:
            os.unlink(log_path)
        except FileNotFoundError:
            pass

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [j for j in jobs if all(j.spec.labels.get(k) == v for k, v in labels.items())]

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            logdir, self._logdir = self._logdir, None
        for job in jobs:
            self.terminate(job, force=True)
            job.handle[0].wait()
        if logdir:
            shutil.rmtree(logdir, ignore_errors=True)


@hookimpl
def fiber_backends() -> dict[str, type[LocalBackend]]:
    return {"local": LocalBackend}
