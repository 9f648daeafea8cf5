"""The example backend: every job is a wrapped process of this machine with a directory
in the spool, ``<example_spool>/<job id>/``, holding

* ``spec.json``: the job's name and labels (what ``list_jobs`` matches);
* ``pid``: the wrapper's process id (the job's process group);
* ``log``: the job's stdout and stderr;
* ``exit``: its exit status, written by the wrapper (:mod:`fiber_example.run`) at the end;
* ``cancelled``: written by :meth:`ExampleBackend.terminate` before it signals the job.

That is the shape of a batch scheduler (a queue any process can read, accounting that
outlives the job), so each method maps to what a scheduler's command would do:
``create_job`` is the submission, ``status`` the accounting query, ``terminate`` the
cancel, ``release`` the purge of finished records.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fiber.backend import Backend, Job, JobCreationError, JobSpec, JobState, JobStatus


class ExampleBackend(Backend):
    name = "example"
    poll_interval = 0.2
    logs_lag = 0.0  # the log file is complete when the job has ended
    capabilities = frozenset({"logs", "list_jobs"})
    # jobs are this user's processes, whose environment only this user and root can
    # read, and the spool keeps no copy of it: the core may put the run's secret there
    # (a real cluster shows a job's environment to others: deliver it privately, as
    # described for secrets_delivery in fiber.backend)
    secrets_delivery = "env"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.spool = Path(options["example_spool"])

    # -- submission ----------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> Job:
        if not spec.command or shutil.which(spec.command[0]) is None:
            raise JobCreationError(f"the example backend cannot run {spec.command[:1]!r}: "
                                   "no such program (give an absolute path or one on PATH)")
        job_id = uuid.uuid4().hex[:12]
        jobdir = self.spool / job_id
        jobdir.mkdir(parents=True, mode=0o700)
        (jobdir / "spec.json").write_text(json.dumps({"name": spec.name,
                                                      "labels": spec.labels}))
        env = {**os.environ, **spec.env,
               "EXAMPLE_JOB_MARKER": str(self.options["example_marker"])}
        with open(jobdir / "log", "wb") as log:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "fiber_example.run", str(jobdir), *spec.command],
                    env=env, cwd=spec.cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:  # a bad cwd, say: nothing is left behind
                shutil.rmtree(jobdir, ignore_errors=True)
                raise JobCreationError(f"the example backend cannot start the job: {exc}") \
                    from exc
        (jobdir / "pid").write_text(str(proc.pid))
        return Job(id=job_id, backend=self.name, spec=spec, host="localhost", handle=proc)

    # -- accounting ----------------------------------------------------------------
    def status(self, job: Job) -> JobStatus:
        jobdir = self.spool / job.id
        if isinstance(job.handle, subprocess.Popen):
            job.handle.poll()  # reap our own child, so that it does not look alive
        if self._alive(jobdir):
            return JobStatus(JobState.RUNNING)
        cancelled = (jobdir / "cancelled").exists()
        try:
            code = int((jobdir / "exit").read_text())
        except (FileNotFoundError, ValueError):
            if cancelled:  # killed with the wrapper before it could write a status
                return JobStatus(JobState.CANCELLED, -signal.SIGKILL)
            if not jobdir.exists():
                return JobStatus(JobState.LOST, reason="no such job")
            return JobStatus(JobState.LOST, reason="ended without an exit status")
        return JobStatus.from_exit(code, cancelled=cancelled)

    def _alive(self, jobdir: Path) -> bool:
        # the job's process group, not the wrapper alone: killed by SIGKILL, the wrapper
        # can end (and be reaped) before the command, whose sockets then still accept
        try:
            pid = int((jobdir / "pid").read_text())
            os.killpg(pid, 0)
            if not _group_running(pid):
                return False
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return False
        except PermissionError:  # alive, though another user's (a reused pid)
            return True
        return not (jobdir / "exit").exists()

    # -- cancel and purge ----------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        jobdir = self.spool / job.id
        if not self._alive(jobdir):
            return
        (jobdir / "cancelled").touch()
        try:
            os.killpg(int((jobdir / "pid").read_text()),
                      signal.SIGKILL if force else signal.SIGTERM)
        except (ProcessLookupError, FileNotFoundError):
            pass  # it ended meanwhile

    def logs(self, job: Job) -> str:
        try:
            return (self.spool / job.id / "log").read_bytes().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def release(self, job: Job) -> None:
        if not self._alive(self.spool / job.id):
            shutil.rmtree(self.spool / job.id, ignore_errors=True)

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        found = []
        for spec_file in self.spool.glob("*/spec.json"):
            try:
                recorded = json.loads(spec_file.read_text())
            except (OSError, ValueError):
                continue  # being created or purged right now
            if all(recorded["labels"].get(k) == v for k, v in labels.items()):
                spec = JobSpec(command=[], name=recorded["name"], labels=recorded["labels"])
                found.append(Job(id=spec_file.parent.name, backend=self.name, spec=spec,
                                 host="localhost"))
        return found


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is running, not a zombie (a zombie has closed
    its files; on a machine whose init does not reap them it stays signalable)."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: take the signal's word
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
