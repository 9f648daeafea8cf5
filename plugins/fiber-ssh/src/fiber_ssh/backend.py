"""The ``ssh`` backend: every job is a process on one of a list of SSH hosts.

Each job is one session channel on the host's pooled connection
(:mod:`fiber_ssh.connection`), started by the wrapper of :mod:`fiber_ssh.remote`. A
reader thread per job drains the channel into a log buffer and records the exit status.
Placement (:mod:`fiber_ssh.placement`) picks the host with the most free slots; when
all are taken a job stays PENDING until one frees (``ssh_when_full=wait``) or creation
fails (``ssh_when_full=fail``). A job whose host's connection dies is LOST.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import paramiko

from fiber.backend import Backend, ClusterUnreachableError, JobCreationError
from fiber.job import Job, JobSpec, JobState, JobStatus
from fiber_ssh import remote
from fiber_ssh.connection import HostConnection
from fiber_ssh.hosts import HostSyntaxError, resolve_hosts
from fiber_ssh.placement import HostSlots, Placement

logger = logging.getLogger("fiber.ssh")

LOG_LIMIT = 16 * 1024 * 1024  # bytes of output kept per job (the end is kept)


class _Handle:
    """The backend's private state of one job."""

    def __init__(self, request: tuple[int, int | None]) -> None:
        self.request = request  # (slots, memory MiB)
        self.host: HostSlots | None = None
        self.channel: paramiko.Channel | None = None
        self.pid: int | None = None
        self.output = bytearray()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.final: JobStatus | None = None
        self.cancelled = False
        self.released = False


class SSHBackend(Backend):
    """Jobs as processes on SSH hosts."""

    name = "ssh"
    poll_interval = 0.5

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self._options = dict(options)
        try:
            specs = resolve_hosts(self._options)
        except HostSyntaxError as exc:
            raise ClusterUnreachableError(str(exc)) from None
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
            threads = [threading.Thread(target=host.prepare, daemon=True) for host in self._hosts]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if not any(host.usable for host in self._hosts):
                reasons = "; ".join(f"{host.conn.spec.name}: {host.conn.error}"
                                    for host in self._hosts)
                raise ClusterUnreachableError(f"no SSH host is reachable ({reasons})")
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
    def create_job(self, spec: JobSpec) -> Job:
        if not spec.command:
            raise JobCreationError(f"job {spec.name} has an empty command")
        try:
            remote.env_script(spec.env)
        except ValueError as exc:
            raise JobCreationError(f"cannot start job {spec.name}: {exc}") from None
        self._ensure_hosts()
        request = self._placement.request(spec)
        self._placement.check_fits(request, spec.name)
        with self._lock:
            if self._closed:
                raise JobCreationError("the ssh backend is closed")
            job = Job(id=f"ssh-{uuid.uuid4().hex[:16]}", backend=self.name, spec=spec,
                      handle=_Handle(request))
            host = self._placement.take(request) if not self._pending else None
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
                self._start(job, host)
                return job
            except ClusterUnreachableError as exc:
                # the host died since it was last used: try the others
                host.mark_down(exc)
                with self._lock:
                    self._placement.give_back(host, request)
                    host = self._placement.take(request)
                    if host is None:
                        self._jobs.pop(job.id, None)
                        self._lock.notify_all()
                        raise
                logger.warning("%s; starting job %s on another host", exc, spec.name)
            except Exception:
                with self._lock:
                    self._jobs.pop(job.id, None)
                    self._placement.give_back(host, request)
                    self._lock.notify_all()
                raise

    def _start(self, job: Job, host: HostSlots) -> None:
        """Open the channel, run the wrapper, read its first line (pid or error)."""
        handle: _Handle = job.handle
        spec = job.spec
        name = host.conn.spec.name
        handle.host = host
        job.host = name
        cwd = self._options.get("ssh_cwd") or spec.cwd
        try:
            chan = host.conn.open_channel()
        except ClusterUnreachableError as exc:
            host.mark_down(exc)
            raise
        try:
            chan.set_combine_stderr(True)
            chan.settimeout(float(self._options.get("ssh_connect_timeout") or 10.0) + 20)
            chan.exec_command(remote.command_line(spec.command, cwd))
            chan.sendall(remote.env_script(spec.env).encode())
            chan.shutdown_write()
            first = bytearray()
            while b"\n" not in first:
                data = chan.recv(65536)
                if not data:
                    break
                first.extend(data)
        except (TimeoutError, paramiko.SSHException, OSError) as exc:
            chan.close()
            raise ClusterUnreachableError(
                f"starting job {spec.name} on SSH host {name} failed: {exc}") from None
        if not first and not host.conn.alive:
            chan.close()
            raise ClusterUnreachableError(
                f"SSH host {name} went away while job {spec.name} was starting")
        line, _, rest = bytes(first).partition(b"\n")
        text = line.decode("utf-8", "replace")
        if text.startswith(remote.PID_MARK):
            handle.pid = int(text[len(remote.PID_MARK):])
            handle.channel = chan
            handle.output.extend(rest)
            chan.settimeout(None)
            threading.Thread(target=self._reader, args=(job,), daemon=True,
                             name=f"fiber-ssh-{spec.name}").start()
            if handle.cancelled:  # terminated while it was being started from the queue
                self.terminate(job, force=True)
            return
        chan.close()
        raise JobCreationError(self._start_error(spec, name, text, bytes(first)))

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
            self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                name="fiber-ssh-dispatch")
            self._dispatcher.start()

    def _dispatch(self) -> None:
        """Start pending jobs, in order, as slots free up."""
        while True:
            with self._lock:
                while True:
                    if self._closed or not self._pending:
                        self._dispatcher = None
                        return
                    job = self._pending[0]
                    host = self._placement.take(job.handle.request)
                    if host is not None:
                        self._pending.popleft()
                        break
                    if not self._placement.any_usable():
                        self._pending.popleft()
                        self._finish(job, JobStatus(JobState.LOST, None, "NoHostLeft"))
                        continue
                    self._lock.wait(1.0)
            try:
                self._start(job, host)
            except Exception as exc:  # noqa: BLE001 -- reported as the job's status
                logger.warning("%s", exc)
                with self._lock:
                    self._placement.give_back(host, job.handle.request)
                    if isinstance(exc, ClusterUnreachableError):
                        host.mark_down(exc)
                        if self._placement.any_usable() and not job.handle.cancelled:
                            self._pending.appendleft(job)  # try the other hosts
                            continue
                    job.handle.output.extend(f"{exc}\n".encode())
                    state = (JobState.LOST if isinstance(exc, ClusterUnreachableError)
                             else JobState.FAILED)
                    self._finish(job, JobStatus(state, None if state is JobState.LOST else 127,
                                                "StartFailed"))

    def _finish(self, job: Job, status: JobStatus) -> None:
        handle: _Handle = job.handle
        if handle.final is None:
            handle.final = status
        handle.done.set()

    # -- watching -----------------------------------------------------------------
    def _reader(self, job: Job) -> None:
        handle: _Handle = job.handle
        chan = handle.channel
        try:
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                with handle.lock:
                    handle.output.extend(data)
                    if len(handle.output) > LOG_LIMIT:
                        del handle.output[: len(handle.output) - LOG_LIMIT]
        except (OSError, EOFError, paramiko.SSHException) as exc:
            logger.debug("reading the output of %s: %s", job.id, exc)
        code = chan.recv_exit_status()
        signalled = getattr(chan, "fiber_exit_signal", None)
        chan.close()
        status = self._final_status(handle, code, signalled)
        with self._lock:
            if handle.host is not None:
                self._placement.give_back(handle.host, handle.request)
            self._finish(job, status)
            self._lock.notify_all()

    def _final_status(self, handle: _Handle, code: int, signalled: tuple | None) -> JobStatus:
        if signalled is None and code == -1:
            host = handle.host
            if host is not None and not host.conn.alive:
                host.mark_down(ClusterUnreachableError(
                    f"SSH host {host.conn.spec.name} became unreachable"))
                return JobStatus(JobState.LOST, None, "HostUnreachable")
            return JobStatus(JobState.LOST if not handle.cancelled else JobState.CANCELLED,
                             None, "NoExitStatus")
        if code == 0:
            return JobStatus(JobState.SUCCEEDED, 0)
        reason = None
        if code < 0:
            try:
                reason = signal.Signals(-code).name
            except ValueError:
                reason = f"signal {-code}"
        if handle.cancelled:
            return JobStatus(JobState.CANCELLED, code, reason)
        return JobStatus(JobState.FAILED, code, reason)

    def status(self, job: Job) -> JobStatus:
        handle: _Handle = job.handle
        if handle.final is not None:
            return handle.final
        if handle.channel is None:
            return JobStatus(JobState.PENDING)
        return JobStatus(JobState.RUNNING)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        return {job.id: self.status(job) for job in jobs}

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        handle: _Handle = job.handle
        if not handle.done.wait(timeout):
            return None
        return handle.final

    def logs(self, job: Job) -> str:
        handle: _Handle = job.handle
        with handle.lock:
            return bytes(handle.output).decode("utf-8", "replace")

    # -- ending -------------------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        handle: _Handle = job.handle
        with self._lock:
            if handle.final is not None:
                return
            if handle.channel is None and job in self._pending:
                self._pending.remove(job)
                handle.cancelled = True
                self._finish(job, JobStatus(JobState.CANCELLED, None, "CancelledPending"))
                return
            handle.cancelled = True
        if handle.pid is None or handle.host is None or handle.done.is_set():
            return
        try:
            handle.host.conn.run(remote.kill_command(handle.pid, force), timeout=15)
        except ClusterUnreachableError as exc:
            logger.debug("cannot signal job %s: %s", job.id, exc)

    def release(self, job: Job) -> None:
        handle: _Handle = job.handle
        if not handle.done.is_set():
            return
        with self._lock:
            self._jobs.pop(job.id, None)
            handle.released = True
        with handle.lock:
            handle.output = bytearray()

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        with self._lock:
            jobs = list(self._jobs.values())
        return [j for j in jobs if all(j.spec.labels.get(k) == v for k, v in labels.items())]

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
