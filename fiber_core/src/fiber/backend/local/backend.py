"""The built-in ``local`` backend: every job is a subprocess of this machine.

It registers as any third-party backend does: fiber-core's entry point ``local`` (group
``fiber``) names this module's :data:`plugin` declaration. Each job runs
in its own session (so terminate reaches the whole process group); its stdout and
stderr go to a log file that :meth:`LocalBackend.logs` reads and
:meth:`LocalBackend.release` deletes. Its jobs share this machine: it reserves and
limits nothing for them. cpu and memory requests (the settings, ``resources=``,
``@fiber.meta``) are accepted, so that a program written for a cluster runs here
unchanged, but not enforced: the first job that carries one logs a warning saying so
(once per process). A gpu or walltime request is refused
(:meth:`LocalBackend.check_resources`). The run's secret reaches a job in its
environment (``secrets_delivery = "env"``: a process's environment is readable only by
its user and root), never on its command line.

Every job is recorded in a directory private to the user
(:mod:`fiber.backend.local.records`), so that :meth:`LocalBackend.list_jobs`,
:meth:`~LocalBackend.terminate` and :meth:`~LocalBackend.release` work from another
process too (the ``fiber jobs`` and ``fiber clean`` commands); the exit status of a job
is known only to the process that created it.

Jobs that run a module of fiber itself with this interpreter (``python -m M``: the
core's job entry point) are forked from a pre-imported template process
(:mod:`fiber.backend.local.forkserver`) unless the setting ``local_start_method`` is
``spawn``; every other command is a new subprocess. The template is started when the
main process says it expects jobs (:meth:`LocalBackend.expect_jobs`: it is creating
its hub), so that its start overlaps the rest of the parent's set-up; in a job, at its
first job. A template that dies (killed, out of memory) is replaced: the jobs forked
from it are ended (they are reported killed, exit code -9, as before), a spawn it had
not answered is sent to a new template, and the next jobs fork from that one. A
template that dies again at once is an error (:data:`TEMPLATE_RESTARTS`). A template
that does not answer a spawn for :data:`SPAWN_TIMEOUT` seconds (frozen, starved) is a
transient error, retried by the core like a cluster manager's; the child it forks once
it answers late is ended.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from fiber import util
from fiber.backend import Backend, JobCreationError
from fiber.backend.job import Job, JobSpec, JobState, JobStatus
from fiber.backend.local import records
from fiber.backend.local.template import ForkedChild, ForkServer, TemplateExited
from fiber.backend.options import ConfigOption
from fiber.backend.plugin import CONTRACT_VERSION, Plugin
from fiber.backend.resources import Resources
from fiber.errors import ConfigError

logger = logging.getLogger("fiber")

# jobs that run a module of this package (fiber's own job entry point) can be forked
# from the template, which has imported fiber already
_OWN_PACKAGE = __name__.split(".")[0] + "."
#: new templates one job's start may use after the one it asked died
TEMPLATE_RESTARTS = 2
#: seconds a job's start waits for the template's answer before it is retried
SPAWN_TIMEOUT = 30.0


_environ_lock = threading.Lock()
_environ_seen: tuple[dict[bytes, bytes], dict[str, str]] | None = None


def environment() -> dict[str, str]:
    """A new copy of this process's environment (``os.environ`` as it is now), the
    base of a job's. Decoding every variable for every job was a tenth of a job's start
    in the parent: the decoded copy is kept and made again only once ``os.environ``
    changed (its raw bytes, compared whole: a C-level comparison of two dicts). Reads
    ``os.environ._data``, the mapping ``os.environ`` keeps its values in (CPython's
    ``os._Environ`` since 3.2); without it, decodes every time."""
    global _environ_seen
    raw = getattr(os.environ, "_data", None)
    if not isinstance(raw, dict):
        return dict(os.environ)
    with _environ_lock:
        if _environ_seen is None or _environ_seen[0] != raw:
            _environ_seen = (dict(raw), dict(os.environ))
        return dict(_environ_seen[1])


class _Proc(Protocol):
    """What the backend uses of a job's process: a Popen, a job forked by the template
    (:class:`ForkedChild`) or a job of another process (:class:`_OtherProcess`)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...


class _Handle:
    """``Job.handle`` of a local job: its process, its log file and its record's start
    time (None when it was not recorded)."""

    __slots__ = ("proc", "log_path", "recorded", "cancelled")

    def __init__(self, proc: _Proc, log_path: str, recorded: int | None) -> None:
        self.proc = proc
        self.log_path = log_path
        self.recorded = recorded
        self.cancelled = False


_warned_not_enforced = False


def _warn_not_enforced(spec: JobSpec) -> None:
    """Say once per process that the local backend does not enforce a job's requests."""
    global _warned_not_enforced
    if _warned_not_enforced:
        logger.debug("local backend does not enforce the requests of %s", spec.name)
        return
    _warned_not_enforced = True
    asked = ", ".join(f"{name}={value}{' MiB' if name == 'memory' else ''}"
                      for name, value in (("cpu", spec.cpu), ("memory", spec.memory),
                                          ("gpu", spec.gpu)) if value)
    logger.warning("the local backend does not enforce resource requests (%s, of %s and "
                   "any later job): its jobs share this machine's cores and memory; a "
                   "container or cluster backend enforces them", asked, spec.name)


class LocalBackend(Backend):
    """Jobs as subprocesses of this process."""

    name = "local"
    capabilities = frozenset({"logs", "list_jobs"})
    poll_interval = 0.2
    logs_lag = 0.0  # a job's log file is complete when its process has ended
    # the run's secret goes into the job's environment: a forked job's reaches it in
    # the fork request, over the template's private socket pair; a spawned job's is
    # its initial environment, which /proc/<pid>/environ shows only to its user and
    # root (as private as a 0600 file), never on its command line
    secrets_delivery = "env"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._logdir: str | None = None
        self._forkserver: ForkServer | None = None
        self._use_forkserver = options.get("local_start_method", "forkserver") == "forkserver"
        self._job_modules: set[str] = set()  # what forked jobs run: the template imports it

    def check_resources(self, resources: Resources) -> None:
        """Refuse a gpu or walltime request, saying what this backend does with the
        others (they are accepted, not enforced); then the default checks."""
        for name in ("gpu", "walltime"):
            value = getattr(resources, name)
            if value:
                raise ConfigError(
                    f"the local backend cannot honour a {name} request ({value!r}): its "
                    "jobs are processes of this machine, for which it reserves and "
                    "limits nothing (cpu and memory requests are accepted but not "
                    "enforced): drop the request or use a backend that can (docker, "
                    "kubernetes, slurm)")
        super().check_resources(resources)

    def _template(self) -> ForkServer:
        with self._lock:
            if self._forkserver is None or self._forkserver.dead:
                if self._forkserver is not None:
                    logger.info("starting a new template process for the local backend")
                self._forkserver = ForkServer(sorted(self._job_modules))
            return self._forkserver

    def _forked(self, module: str, env: dict[str, str], cwd: str | None,
                log_path: str) -> ForkedChild:
        for restarts in itertools.count():
            try:
                return self._template().spawn(module, env, cwd, log_path, SPAWN_TIMEOUT)
            except TemplateExited:
                if restarts >= TEMPLATE_RESTARTS:
                    raise
        raise AssertionError("unreachable")  # (the loop returns or raises)

    def _forkable(self, command: Sequence[str]) -> str | None:
        """The module of ``command`` when it is ``[this python, -m, M]`` with M a module
        of fiber itself, which the template runs in a fork of itself; else None."""
        if (self._use_forkserver and len(command) == 3 and command[0] == sys.executable
                and command[1] == "-m" and command[2].startswith(_OWN_PACKAGE)):
            return command[2]
        return None

    def expect_jobs(self, command: Sequence[str]) -> None:
        # the main process is about to create jobs: start the template now, in parallel
        # with the core's set-up, with the jobs' module imported before the first fork (a
        # job, such as a Manager's server, may never create one, so there the template
        # starts with its first job)
        module = self._forkable(command)
        if module is not None:
            with self._lock:
                self._job_modules.add(module)
            try:
                self._template()
            except JobCreationError as exc:
                logger.debug("%s", exc)  # create_job() will report it

    def _log_path(self, name: str) -> str:
        with self._lock:
            if self._logdir is None:
                # named after this process: `fiber clean` removes it once this process
                # is gone (killed: its exit path never ran)
                self._logdir = tempfile.mkdtemp(prefix=records.log_directory_prefix())
                # after the children's jobs were released (their logs removed)
                _logdirs.add(self._logdir)
                util.at_exit("local logs", util.LATE_FINALIZERS, _remove_empty_logdirs)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
        return tempfile.mktemp(prefix=safe + "-", suffix=".log", dir=self._logdir)

    def create_job(self, spec: JobSpec) -> Job:
        if spec.cpu or spec.memory or spec.gpu:
            _warn_not_enforced(spec)
        env = environment()
        env.update(spec.env)
        log_path = self._log_path(spec.name)
        module = self._forkable(spec.command)
        if module is not None:
            with self._lock:
                self._job_modules.add(module)  # a template started later imports it first
            return self._add(spec, self._forked(module, env, spec.cwd, log_path), log_path)
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
        return self._add(spec, popen, log_path)

    def _add(self, spec: JobSpec, proc: _Proc, log_path: str) -> Job:
        recorded = records.write(proc.pid, spec.name, spec.labels, log_path)
        job = Job(id=str(proc.pid), backend=self.name, spec=spec, host="localhost",
                  handle=_Handle(proc, log_path, recorded), pid=proc.pid)
        with self._lock:
            self._jobs[job.id] = job
        return job

    @staticmethod
    def _to_status(returncode: int | None, cancelled: bool = False) -> JobStatus:
        if returncode is None:
            return JobStatus(JobState.RUNNING)
        return JobStatus.from_exit(returncode, cancelled=cancelled)

    def status(self, job: Job) -> JobStatus:
        handle: _Handle = job.handle
        code = handle.proc.poll()
        if isinstance(handle.proc, _OtherProcess) and code is not None:
            # ended; its exit status went to the process that created it
            if handle.cancelled:
                return JobStatus.from_exit(code, cancelled=True)
            return JobStatus(JobState.LOST, None, "ended")
        return self._to_status(code, handle.cancelled)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        return {job.id: self.status(job) for job in jobs}

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        try:
            job.handle.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.status(job)

    def terminate(self, job: Job, force: bool = False) -> None:
        handle: _Handle = job.handle
        proc = handle.proc
        if proc.poll() is not None:
            return
        handle.cancelled = True
        sig = signal.SIGKILL if force else signal.SIGTERM
        if isinstance(proc, _OtherProcess):
            proc.sent = sig
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            # no group (yet: a just-forked job makes its own session first thing)
            proc.send_signal(sig)

    def logs(self, job: Job) -> str:
        try:
            with open(job.handle.log_path, "rb") as log:
                return log.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def release(self, job: Job) -> None:
        handle: _Handle = job.handle
        if handle.proc.poll() is None:
            return
        with self._lock:
            self._jobs.pop(job.id, None)
        if handle.recorded is not None:
            records.remove(handle.proc.pid, handle.recorded)
        if isinstance(handle.proc, _OtherProcess) and handle.proc.record.owner_alive():
            return  # its creator reads the log and removes it
        try:
            os.unlink(handle.log_path)
        except FileNotFoundError:
            pass
        if isinstance(handle.proc, _OtherProcess):
            try:  # the log directory of a creator that is gone, once empty
                os.rmdir(os.path.dirname(handle.log_path))
            except OSError:
                pass

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        """This user's local jobs whose labels include ``labels``: the ones this
        instance created, and the running ones that other processes created."""
        with self._lock:
            found = dict(self._jobs)
        for record in records.read_all():
            job_id = str(record.pid)
            if job_id in found and found[job_id].handle.recorded == record.started:
                continue
            spec = JobSpec(command=[], name=record.name, labels=record.labels)
            found[job_id] = Job(id=job_id, backend=self.name, spec=spec, host="localhost",
                                handle=_Handle(_OtherProcess(record), record.log,
                                               record.started))
        return [j for j in found.values()
                if all(j.spec.labels.get(k) == v for k, v in labels.items())]

    def close(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            logdir, self._logdir = self._logdir, None
        for job in jobs:
            self.terminate(job, force=True)
            job.handle.proc.wait()
            if job.handle.recorded is not None:
                records.remove(job.handle.proc.pid, job.handle.recorded)
        with self._lock:
            server, self._forkserver = self._forkserver, None
        if server is not None:
            server.close()
        if logdir:
            shutil.rmtree(logdir, ignore_errors=True)


_logdirs: set[str] = set()


def _remove_empty_logdirs() -> None:
    """At exit: the backends' log directories go if no job's log is left in them (a
    job still running keeps its directory, and its log)."""
    for logdir in list(_logdirs):
        try:
            os.rmdir(logdir)
            _logdirs.discard(logdir)
        except OSError:
            pass


class _OtherProcess:
    """A job that another process created, found by its record, with the parts of
    Popen's interface the backend uses. Its exit status goes to its creator: here
    ``poll()`` says only that it ended (the negative signal this process sent it, or 0)."""

    def __init__(self, record: records.Record) -> None:
        self.pid = record.pid
        self.record = record
        self.sent: int | None = None

    def poll(self) -> int | None:
        if self.record.alive():
            return None
        return -self.sent if self.sent else 0

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"job {self.pid}", timeout or 0.0)
            time.sleep(0.02)

    def send_signal(self, sig: int) -> None:
        if self.record.alive():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


#: the built-in backend's declaration (fiber-core's entry point ``local``), made like
#: any third-party plugin's
plugin = Plugin(
    package="fiber-core",
    contract=CONTRACT_VERSION,  # the core's own backend: always this contract
    backends={"local": f"{__name__}:LocalBackend"},
    options=[ConfigOption(
        "local_start_method", str.lower, "forkserver",
        "how the local backend starts fiber's own jobs: forked from a pre-imported "
        "template (fast) or as new interpreters", ("forkserver", "spawn"))],
)
