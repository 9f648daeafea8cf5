"""The ``ssh`` backend: every job is a process on one of a list of SSH hosts.

Each job is one session channel on the host's pooled connection
(:mod:`fiber_ssh.connection`), started by the wrapper of :mod:`fiber_ssh.remote`. A
reader thread per job reads the wrapper's pid line, drains the channel into a log
buffer and records the exit status. A job is PENDING until its pid is known.
Placement (:mod:`fiber_ssh.placement`) picks the host with the most free slots; when
all are taken a job stays PENDING until one frees (``ssh_when_full=wait``) or creation
fails (``ssh_when_full=fail``). A job whose host's connection dies is LOST.

Every job carries its id, name and labels in its environment
(:data:`fiber_ssh.remote.JOB_VAR` and the others), so :meth:`SSHBackend.list_jobs`
finds on the hosts the jobs that other processes of the same user started (what
``fiber jobs`` and ``fiber clean`` need): such a job is watched and ended through new
sessions by its pid (:class:`_Found`), as it has no channel here.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import paramiko

from fiber.backend import (
    Backend,
    ClusterUnreachableError,
    FiberThreadError,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
    start_thread,
)
from fiber_ssh import remote
from fiber_ssh.connection import HostConnection
from fiber_ssh.hosts import HostSyntaxError, resolve_hosts
from fiber_ssh.placement import HostSlots, Placement

logger = logging.getLogger("fiber.ssh")

LOG_LIMIT = 16 * 1024 * 1024  # bytes of output kept per job (the end is kept)
UNREACHABLE = "unreachable"  # start_error of a job whose host went away while starting


class _Handle:
    """The backend's private state of one job."""

    def __init__(self, request: tuple[int, int | None]) -> None:
        self.request = request  # (slots, memory MiB)
        self.slot_host: HostSlots | None = None  # where its slots are reserved
        self.host: HostSlots | None = None  # where it was started
        self.channel: paramiko.Channel | None = None
        self.pid: int | None = None
        self.started = threading.Event()  # pid or start error known
        self.start_error: str | None = None
        self.output = bytearray()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.final: JobStatus | None = None
        self.cancelled = False


class _Found:
    """A job another process started, found on ``host`` by :meth:`SSHBackend.list_jobs`:
    followed by its pid through new sessions (its exit status is its starter's to know)."""

    def __init__(self, host: HostSlots, pid: int) -> None:
        self.host = host
        self.pid = pid
        self.cancelled = False
        self.final: JobStatus | None = None


def _prepare_died(host: HostSlots, error: FiberThreadError) -> None:
    """A host's preparation died: the host is not used (a bug, not an outage: not
    worth retrying), and the error says why."""
    down = ClusterUnreachableError(str(error), transient=False)
    down.__cause__ = error
    host.mark_down(down)


def _kill_died(handle: _Handle, error: FiberThreadError) -> None:
    """The thread ending a job cancelled during its start died: end it here."""
    _end_by_channel(handle)


def _end_by_channel(handle: _Handle) -> None:
    """Kill the job through its wrapper's relay (which reads the channel's stdin after
    the environment, so this works before its pid is read too), then close its
    channel; without a word from here (no thread of ours may block on a new session)."""
    chan = handle.channel
    if chan is None:
        return
    try:
        chan.sendall(b"KILL\n")
    except (OSError, EOFError, paramiko.SSHException) as exc:
        logger.debug("cannot signal a job through its channel: %s", exc)
    try:
        chan.close()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        logger.debug("cannot close a job's channel: %s", exc)


class SSHBackend(Backend):
    """Jobs as processes on SSH hosts."""

    name = "ssh"
    poll_interval = 0.5
    # list_jobs searches the hosts for the jobs of other processes of this user too
    capabilities = frozenset({"logs", "list_jobs"})
    # the run's secret goes with the environment on the channel's stdin to the
    # wrapper, which exports it (fiber_ssh.remote): never on a command line or in a file
    secrets_delivery = "private"

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._options = dict(options)
        try:
            specs = resolve_hosts(self._options)
        except HostSyntaxError as exc:
            raise ClusterUnreachableError(str(exc), transient=False) from None
        self._hosts = [HostSlots(HostConnection(spec, self._options)) for spec in specs]
        self._placement = Placement(self._hosts)
        self._lock = threading.Condition()
        self._ready = False
        self._jobs: dict[str, Job] = {}
        self._pending: deque[Job] = deque()
        self._closed = False
        self._dispatcher: threading.Thread | None = None

    # -- hosts --------------------------------------------------------------------
    def _ensure_hosts(self) -> None:
        """Connect to every host (in parallel) and learn its slots, once."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            threads = [start_thread("fiber-ssh-prepare", host.prepare,
                                    name=f"fiber-ssh-prepare-{host.conn.spec.name}",
                                    fails=functools.partial(_prepare_died, host))
                       for host in self._hosts]
            for thread in threads:
                thread.join()
            if not any(host.usable for host in self._hosts):
                reasons = "; ".join(f"{host.conn.spec.name}: {host.conn.error}"
                                    for host in self._hosts)
                # worth retrying unless every host failed for a setting
                transient = any(getattr(host.conn.error, "transient", True)
                                for host in self._hosts)
                raise ClusterUnreachableError(f"no SSH host is reachable ({reasons})",
                                              transient=transient)
            for host in self._hosts:
                if not host.usable:
                    logger.warning("SSH host %s is not used: %s", host.conn.spec.name,
                                   host.conn.error)
            self._ready = True

    def listen_address(self) -> str:
        explicit = self._options.get("ssh_listen_address")
        if explicit:
            return str(explicit)
        self._ensure_hosts()
        for host in self._hosts:
            if host.conn.alive:
                sock = host.conn.connect().sock
                if isinstance(sock, socket.socket):
                    return sock.getsockname()[0]
        return "127.0.0.1"

    # -- creating -----------------------------------------------------------------
    def _take(self, handle: _Handle) -> HostSlots | None:
        host = self._placement.take(handle.request)
        handle.slot_host = host
        return host

    def _give_back(self, handle: _Handle) -> None:
        if handle.slot_host is not None:
            self._placement.give_back(handle.slot_host, handle.request)
            handle.slot_host = None
            self._lock.notify_all()

    def create_job(self, spec: JobSpec) -> Job:
        if not spec.command:
            raise JobCreationError(f"job {spec.name} has an empty command")
        try:
            remote.env_script({**spec.env, **spec.secrets})
        except ValueError as exc:
            raise JobCreationError(f"cannot start job {spec.name}: {exc}") from None
        self._ensure_hosts()
        request = self._placement.request(spec)
        self._placement.check_fits(request, spec.name)
        with self._lock:
            if self._closed:
                raise JobCreationError("the ssh backend is closed")
            handle = _Handle(request)
            job = Job(id=f"ssh-{uuid.uuid4().hex[:16]}", backend=self.name, spec=spec,
                      handle=handle)
            host = self._take(handle) if not self._pending else None
            if host is None:
                if self._options.get("ssh_when_full", "wait") == "fail":
                    raise JobCreationError(
                        f"no SSH host has a free slot and enough free memory for job "
                        f"{spec.name} ({self._placement.describe()}); wait for jobs to end, "
                        "add hosts or slots, or set FIBER_SSH_WHEN_FULL=wait to queue jobs"
                    )
                self._jobs[job.id] = job
                self._pending.append(job)
                self._start_dispatcher()
                return job
            self._jobs[job.id] = job
        while True:
            try:
                self._start(job, handle, host)
                return job
            except ClusterUnreachableError as exc:
                # the host died since it was last used: try the others
                host.mark_down(exc)
                with self._lock:
                    self._give_back(handle)
                    handle = job.handle = _Handle(request)
                    host = self._take(handle)
                    if host is None:
                        self._jobs.pop(job.id, None)
                        raise
                logger.warning("%s; starting job %s on another host", exc, spec.name)
            except BaseException:
                with self._lock:
                    self._give_back(handle)
                    self._jobs.pop(job.id, None)
                raise

    def _start(self, job: Job, handle: _Handle, host: HostSlots) -> None:
        """Open the channel, run the wrapper and wait (up to ``ssh_start_timeout``) for
        its pid or its error. A start slower than that (a slow login shell) is not an
        error: the job stays PENDING until the reader thread sees the pid."""
        spec = job.spec
        name = host.conn.spec.name
        handle.host = host
        job.host = name
        cwd = self._options.get("ssh_cwd") or spec.cwd
        chan = host.conn.open_channel()
        end = remote.new_end_marker()
        try:
            chan.set_combine_stderr(True)
            chan.exec_command(remote.command_line(spec.command, cwd, end))
            # the secrets travel with the environment, on the channel's stdin
            marks = {remote.JOB_VAR: job.id, remote.NAME_VAR: spec.name,
                     remote.LABELS_VAR: json.dumps(spec.labels, sort_keys=True)}
            chan.sendall(remote.env_script({**spec.env, **spec.secrets, **marks},
                                           end).encode())
        except (TimeoutError, paramiko.SSHException, OSError) as exc:
            chan.close()
            if not host.conn.alive:
                raise ClusterUnreachableError(
                    f"SSH host {name} went away while job {spec.name} was starting") from None
            raise JobCreationError(
                f"cannot start job {spec.name} on SSH host {name}: {exc!r}") from None
        handle.channel = chan
        start_thread("fiber-ssh-reader", self._reader, job, handle,
                     name=f"fiber-ssh-reader-{spec.name}",
                     fails=functools.partial(self._reader_died, job, handle))
        handle.started.wait(float(self._options.get("ssh_start_timeout") or 30.0))
        if handle.start_error is None:
            return
        chan.close()
        handle.done.wait(10)
        if handle.start_error == UNREACHABLE:
            raise ClusterUnreachableError(
                f"SSH host {name} went away while job {spec.name} was starting")
        raise JobCreationError(handle.start_error)

    @staticmethod
    def _start_error(spec: JobSpec, host: str, text: str, output: bytes) -> str:
        if text.startswith(remote.ERROR_MARK):
            kind, _, detail = text[len(remote.ERROR_MARK):].partition(" ")
            if kind == "notfound":
                return (f"cannot start job {spec.name} on SSH host {host}: the program "
                        f"{detail!r} does not exist there (or is not executable). Install the "
                        "same Python with fiber-core and fiber-ssh at the same path on every "
                        "host (shared filesystem or identical environment), or set "
                        "FIBER_PYTHON to the Python of the hosts")
            if kind == "cwd":
                return (f"cannot start job {spec.name} on SSH host {host}: its working "
                        f"directory {detail!r} does not exist there. Share the directory with "
                        "the hosts or set FIBER_SSH_CWD to a directory that exists on them")
            return f"cannot start job {spec.name} on SSH host {host}: {detail}"
        return (f"cannot start job {spec.name} on SSH host {host}: the start wrapper said "
                f"{output.decode('utf-8', 'replace')[-500:]!r}; /bin/sh must exist on the host")

    def _start_dispatcher(self) -> None:
        if self._dispatcher is None or not self._dispatcher.is_alive():
            self._dispatcher = start_thread("fiber-ssh-dispatch", self._dispatch,
                                            fails=self._dispatch_died)

    def _dispatch_died(self, error: FiberThreadError) -> None:
        """The dispatcher died: the jobs waiting for a slot fail with ``error`` (in their
        log) rather than wait for ever; the next queued job starts a new one."""
        with self._lock:
            if self._dispatcher is threading.current_thread():
                self._dispatcher = None
            waiting, self._pending = list(self._pending), deque()
            for job in waiting:
                handle: _Handle = job.handle
                with handle.lock:
                    handle.output.extend(f"fiber-ssh: {error}\n".encode())
                self._finish(handle, JobStatus(JobState.FAILED, 127, "StartFailed"))

    def _dispatch(self) -> None:
        """Start pending jobs, in order, as slots free up."""
        while True:
            with self._lock:
                while True:
                    if self._closed or not self._pending:
                        self._dispatcher = None
                        return
                    job = self._pending[0]
                    handle: _Handle = job.handle
                    host = self._take(handle)
                    if host is not None:
                        self._pending.popleft()
                        break
                    if not self._placement.any_usable():
                        self._pending.popleft()
                        self._finish(handle, JobStatus(JobState.LOST, None, "NoHostLeft"))
                        continue
                    self._lock.wait(1.0)
            try:
                self._start(job, handle, host)
            except Exception as exc:  # noqa: BLE001 -- reported as the job's status
                logger.warning("%s", exc)
                lost = isinstance(exc, ClusterUnreachableError)
                if lost:
                    host.mark_down(exc)
                with self._lock:
                    self._give_back(handle)
                    if lost and not handle.cancelled and self._placement.any_usable():
                        job.handle = _Handle(handle.request)
                        self._pending.appendleft(job)  # try the other hosts
                        continue
                    if handle.final is None:
                        with handle.lock:
                            handle.output.extend(f"fiber-ssh: {exc}\n".encode())
                    if handle.cancelled:
                        status = JobStatus(JobState.CANCELLED, None, "CancelledPending")
                    elif lost:
                        status = JobStatus(JobState.LOST, None, "StartFailed")
                    else:
                        status = JobStatus(JobState.FAILED, 127, "StartFailed")
                    self._finish(handle, status)

    @staticmethod
    def _finish(handle: _Handle, status: JobStatus) -> None:
        if handle.final is None:
            handle.final = status
        handle.done.set()

    # -- watching -----------------------------------------------------------------
    def _reader(self, job: Job, handle: _Handle) -> None:
        """Read the wrapper's pid (or error) line, then drain the output until the
        channel closes; record the final status and free the slots."""
        chan = handle.channel
        assert chan is not None  # set before the reader starts
        head = bytearray()  # output before the pid line: login-shell noise
        try:
            while True:
                data: bytes | None = chan.recv(65536)
                if not data:
                    break
                if handle.pid is None and handle.start_error is None:
                    head.extend(data)
                    data = self._parse_head(job, handle, head)
                    if data is None:
                        continue
                with handle.lock:
                    handle.output.extend(data)
                    if len(handle.output) > LOG_LIMIT:
                        del handle.output[: len(handle.output) - LOG_LIMIT]
        except (OSError, EOFError, paramiko.SSHException) as exc:
            logger.debug("reading the output of %s: %s", job.id, exc)
        code = chan.recv_exit_status()
        signalled = getattr(chan, "fiber_exit_signal", None)
        chan.close()
        host = handle.host
        if handle.pid is None and handle.start_error is None:
            with handle.lock:
                handle.output.extend(head)
            if host is not None and not host.conn.alive:
                handle.start_error = UNREACHABLE
            else:
                handle.start_error = self._start_error(job.spec, job.host or "?", "",
                                                       bytes(head))
        handle.started.set()
        if handle.start_error == UNREACHABLE:
            status = JobStatus(JobState.LOST, None, "HostUnreachable")
        elif handle.start_error is not None:
            status = JobStatus(JobState.FAILED, code if code > 0 else 127, "StartFailed")
            with handle.lock:
                handle.output.extend(f"\nfiber-ssh: {handle.start_error}\n".encode())
        else:
            status = self._final_status(handle, code, signalled)
        with self._lock:
            self._give_back(handle)
            self._finish(handle, status)

    def _reader_died(self, job: Job, handle: _Handle, error: FiberThreadError) -> None:
        """The job's reader died: nobody reads its output nor sees it end, so it is
        ended (killed through its channel) and reported LOST; a start still waiting
        for its pid fails with ``error``."""
        with handle.lock:
            handle.output.extend(f"\nfiber-ssh: {error}\n".encode())
        if handle.pid is None and handle.start_error is None:
            handle.start_error = str(error)
        handle.started.set()
        _end_by_channel(handle)
        with self._lock:
            self._give_back(handle)
            self._finish(handle, JobStatus(JobState.LOST, None, "ReaderDied"))

    def _parse_head(self, job: Job, handle: _Handle, head: bytearray) -> bytes | None:
        """Look for the wrapper's marker line in ``head``; return the output after it
        (``None`` while it has not come yet)."""
        for mark in (remote.PID_MARK.encode(), remote.ERROR_MARK.encode()):
            at = head.find(mark)
            if at < 0:
                continue
            end = head.find(b"\n", at)
            if end < 0:
                return None
            line = bytes(head[at:end]).decode("utf-8", "replace")
            if head[:at].strip():
                logger.debug("SSH host %s printed %r before starting %s", job.host,
                             bytes(head[:at][-300:]), job.spec.name)
            if mark == remote.PID_MARK.encode():
                handle.pid = int(line[len(remote.PID_MARK):])
                handle.started.set()
                if handle.cancelled:  # terminated before its pid was known
                    start_thread("fiber-ssh-kill", self._kill, handle, True,
                                 fails=functools.partial(_kill_died, handle))
            else:
                handle.start_error = self._start_error(job.spec, job.host or "?", line, b"")
                handle.started.set()
            return bytes(head[end + 1:])
        return None

    def _final_status(self, handle: _Handle, code: int, signalled: tuple | None) -> JobStatus:
        if signalled is None and code == -1:
            host = handle.host
            if host is not None and not host.conn.alive:
                host.mark_down(ClusterUnreachableError(
                    f"SSH host {host.conn.spec.name} became unreachable"))
                return JobStatus(JobState.LOST, None, "HostUnreachable")
            return JobStatus(JobState.LOST if not handle.cancelled else JobState.CANCELLED,
                             None, "NoExitStatus")
        return JobStatus.from_exit(code, cancelled=handle.cancelled)

    def status(self, job: Job) -> JobStatus:
        if isinstance(job.handle, _Found):
            return self._found_status(job)
        handle: _Handle = job.handle
        if handle.final is not None:
            return handle.final
        if handle.pid is None:
            return JobStatus(JobState.PENDING)
        return JobStatus(JobState.RUNNING)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        return {job.id: self.status(job) for job in jobs}

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        if isinstance(job.handle, _Found):
            while True:
                status = self._found_status(job)
                if status.state is not JobState.RUNNING:
                    return status
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                time.sleep(0.2)
        while True:
            handle: _Handle = job.handle  # replaced when a start is retried elsewhere
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if handle.done.wait(0.5 if left is None else min(0.5, left)):
                if job.handle is handle:
                    return handle.final
                continue
            if left is not None and left <= 0.5:
                if handle.done.is_set() and job.handle is handle:
                    return handle.final
                return None

    def logs(self, job: Job) -> str:
        if isinstance(job.handle, _Found):
            return ""  # its output goes to the process that started it
        handle: _Handle = job.handle
        with handle.lock:
            return bytes(handle.output).decode("utf-8", "replace")

    # -- ending -------------------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        if isinstance(job.handle, _Found):
            found: _Found = job.handle
            found.cancelled = True
            found.host.conn.run(remote.kill_command(found.pid, force), timeout=15)
            return
        handle: _Handle = job.handle
        with self._lock:
            if handle.final is not None:
                return
            handle.cancelled = True
            if job in self._pending:
                self._pending.remove(job)
                self._finish(handle, JobStatus(JobState.CANCELLED, None, "CancelledPending"))
                return
        # a job still starting is killed by its reader as soon as its pid is known
        if handle.pid is not None:
            self._kill(handle, force)
        elif force and handle.channel is not None:
            # its wrapper has not reported a pid (it may still wait for its
            # environment): closing the channel ends it, at the end of its stdin
            try:
                handle.channel.close()
            except (OSError, EOFError, paramiko.SSHException) as exc:
                logger.debug("cannot close the channel of %s: %s", job.id, exc)

    def _kill(self, handle: _Handle, force: bool) -> None:
        """Signal the job's process group: through the wrapper's relay on the job's
        own channel, else with ``kill`` in a new session."""
        if handle.done.is_set() or handle.host is None or handle.pid is None:
            return
        try:
            if handle.channel is not None:  # (it is, once the pid is known)
                handle.channel.sendall(b"KILL\n" if force else b"TERM\n")
                return
        except (OSError, EOFError, paramiko.SSHException) as exc:
            logger.debug("cannot signal pid %s through its channel: %s", handle.pid, exc)
        try:
            handle.host.conn.run(remote.kill_command(handle.pid, force), timeout=15)
        except ClusterUnreachableError as exc:
            logger.debug("cannot signal pid %s: %s", handle.pid, exc)

    def release(self, job: Job) -> None:
        if isinstance(job.handle, _Found):
            return
        handle: _Handle = job.handle
        if not handle.done.is_set():
            return
        with self._lock:
            self._jobs.pop(job.id, None)
        with handle.lock:
            handle.output = bytearray()

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        """This instance's jobs with ``labels``, and those that other processes of this
        user started, found on the hosts (all searched at once)."""
        with self._lock:
            jobs = list(self._jobs.values())
        known = {job.id for job in jobs}
        self._ensure_hosts()
        hosts = [host for host in self._hosts if host.usable]
        found: list[list[Job]] = [[] for _ in hosts]
        errors: list[BaseException] = []

        def search(i: int, host: HostSlots) -> None:
            try:
                found[i] = self._found_on(host, known)
            except (ClusterUnreachableError, ValueError) as exc:
                errors.append(exc)

        threads = [start_thread("fiber-ssh-search", search, i, host,
                                name=f"fiber-ssh-search-{host.conn.spec.name}",
                                fails=errors.append)
                   for i, host in enumerate(hosts)]
        for thread in threads:
            thread.join()
        if errors and not any(found):
            raise ClusterUnreachableError(f"cannot list the jobs on the SSH hosts: "
                                          f"{errors[0]}")
        for error in errors:
            logger.warning("some SSH hosts were not searched for jobs: %s", error)
        jobs += [job for jobs_of_host in found for job in jobs_of_host]
        return [j for j in jobs if all(j.spec.labels.get(k) == v for k, v in labels.items())]

    def _found_on(self, host: HostSlots, known: set[str]) -> list[Job]:
        """The jobs of other processes on ``host`` (``known``: this instance's ids)."""
        _, out = host.conn.run(remote.LIST_SCRIPT, timeout=60)
        jobs = []
        for pid, env in remote.parse_listing(out):
            job_id = env[remote.JOB_VAR]
            if job_id in known:
                continue
            try:
                labels = json.loads(env.get(remote.LABELS_VAR, "{}"))
            except ValueError:
                labels = {}
            spec = JobSpec(command=[], name=env.get(remote.NAME_VAR, "fiber-job"),
                           labels={str(k): str(v) for k, v in labels.items()})
            job = Job(id=job_id, backend=self.name, spec=spec, handle=_Found(host, pid))
            job.host = host.conn.spec.name
            jobs.append(job)
        return jobs

    def _found_status(self, job: Job) -> JobStatus:
        found: _Found = job.handle
        if found.final is not None:
            return found.final
        _, out = found.host.conn.run(remote.alive_command(found.pid, job.id), timeout=15)
        if "alive" in out.split():
            return JobStatus(JobState.RUNNING)
        found.final = (JobStatus(JobState.CANCELLED, None, "Killed") if found.cancelled
                       else JobStatus(JobState.LOST, None, "EndedExitStatusUnknown"))
        return found.final

    def close(self) -> None:
        with self._lock:
            self._closed = True
            jobs = list(self._jobs.values())
            self._lock.notify_all()
        for job in jobs:
            self.terminate(job, force=True)
        deadline = time.monotonic() + 10
        for job in jobs:
            job.handle.done.wait(max(0.0, deadline - time.monotonic()))
        for host in self._hosts:
            host.conn.close()
