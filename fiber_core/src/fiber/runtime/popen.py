"""The parent's side of one job-backed process (:class:`JobPopen`): creating its job,
following it through its control channel (:mod:`fiber.runtime.control`: hello,
heartbeats, output) and its backend's statuses, and turning the job's end into an exit
code. The counterpart of multiprocessing's Popen classes (poll, wait, terminate,
kill, sentinel); the child's side is :mod:`fiber.runtime.bootstrap`. Ending many
processes at once, and freeing their jobs at exit, is :mod:`fiber.runtime.teardown`'s.
"""

from __future__ import annotations

import logging
import multiprocessing.spawn
import os
import pickle
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from fiber.backend import Resources, secrets
from fiber.backend.job import Job, JobSpec, JobState, JobStatus
from fiber.errors import ProcessStartError
from fiber.runtime import config, popen_payload, retry, run, submit, teardown, tracebacks
from fiber.runtime.control import ControlChannel, beat_interval
from fiber.runtime.monitor import monitor_for
from fiber.runtime.output import LineWriter
from fiber.runtime.pipes import recording_transit, release_transit
from fiber.runtime.ship import plan as ship
from fiber.wire import auth, serialization

logger = logging.getLogger("fiber")

LOG_TAIL = 4000
KEPT_LOG = 16 * 1024  # of a job that failed by itself: kept_log

_PROCESS_UID = uuid.uuid4().hex[:8]

# signals a process gets from its own faults (a crash), unlike those that end it from
# outside (SIGKILL, SIGTERM: a user, an OOM killer, a preempted node, a dead template)
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE,
                            signal.SIGABRT, signal.SIGSYS, signal.SIGTRAP})


def killed(returncode: int | None) -> bool:
    """Whether an exit code (multiprocessing's convention) says that the process was
    ended by a signal sent from outside, rather than failing or crashing on its own."""
    return (returncode is not None and returncode < 0
            and -returncode not in _CRASH_SIGNALS)


def _new_process_uid() -> None:
    """A forked process (a job forked by the local backend's template) is a parent of
    its own: its jobs get labels of their own."""
    global _PROCESS_UID
    # (as random as uuid4's first 8 hex digits; uuid's Python code copied ~30 pages
    # of the template's memory in every job it forks)
    _PROCESS_UID = os.urandom(4).hex()


os.register_at_fork(after_in_child=_new_process_uid)


def job_labels() -> dict[str, str]:
    return {"fiber.run": run.run_id(), "fiber.parent": _PROCESS_UID}


def job_name(process_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", process_name.lower()).strip("-")
    return ("fiber-" + slug)[:50].rstrip("-")


def preparation_data(name: str) -> dict[str, Any]:
    """What the child needs to look like the parent (sys.path, main module, ...),
    as multiprocessing's spawn start method sends it."""
    data = multiprocessing.spawn.get_preparation_data(name)
    data.pop("authkey", None)
    data.pop("log_to_stderr", None)
    return data


class ProcessObject(Protocol):
    """What a job is made for: a :class:`fiber.Process` (of the API layer, above this
    one), pickled whole for its job."""

    @property
    def name(self) -> str: ...


class JobPopen:
    """Creates the job of a :class:`fiber.Process` and follows it to its end."""

    def __init__(self, process_obj: ProcessObject, target: run.Target) -> None:
        # where the job goes: the target of the process's context (Process.start)
        self.target = target
        cfg = self.target.config()
        self.process_name = process_obj.name
        self.backend = self.target.backend()
        meta = getattr(getattr(process_obj, "_target", None), "__fiber_meta__", {})
        # checked by the backend before anything is made (a request it cannot honour)
        resources = self.target.resources(meta, getattr(process_obj, "_resources", None))
        self.heartbeat_timeout = float(cfg.heartbeat_timeout)
        # each beat costs a round trip per job (a thousand workers: a thousand a
        # beat); a third of the timeout leaves a silent job two beats to spare
        self.heartbeat_interval = min(float(cfg.heartbeat_interval),
                                      self.heartbeat_timeout / 3)
        self.returncode: int | None = None
        self.exit_reported: int | None = None
        self.start_error: ProcessStartError | None = None
        self.pid: int | None = None
        self.host: str | None = None
        # self.job: set once create_job returns (the job may say hello before that)
        self._done = threading.Event()
        self._known = threading.Event()  # its pid is known (it said hello) or it ended
        self._lock = threading.Lock()
        self._sentinel: tuple[int, int] | None = None
        self._connected = False  # it said hello (stays True once it did)
        self._link_up = False  # its connection is up now
        self._distrust_logged = False  # the cluster said LOST while it was alive
        self._released = False
        # the tail of the job's log, read when the job ended by itself with a failure
        # (a lost pool worker's: `fiber dashboard` shows it), before release() frees it
        self.kept_log: str | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._ending = False  # terminate()/kill() was called
        # the exit code (a negative signal) the job was told to end with, over its
        # heartbeat line (ControlChannel.ask_to_end)
        self.asked_to_end: int | None = None
        # the signal terminate()/kill() asked the backend for while the job had not
        # connected: its exit code if the cluster ends it before it runs (a cancelled
        # batch job reports the scheduler's own signal; multiprocessing's kill() is -9)
        self._end_asked_unconnected: int | None = None
        # Pickle before anything exists: an unpicklable target fails here, cleanly.
        with recording_transit() as self._transit, popen_payload.pickling(process_obj.name):
            payload = serialization.dumps_code(process_obj, popen_payload.reducer_for)
        self.bundle = pickle.dumps((preparation_data(process_obj.name), payload), 5)
        self.hub = self.target.hub()
        self.output = LineWriter(f"[{self.process_name}] " if cfg.output_prefix else "",
                                 self.hub.call_later)
        self.channel = ControlChannel(self)
        # stream: the job reaches this process by one stream connection (no nng in a job)
        self.cid = self.hub.add_channel(self.channel, stream=True)
        try:
            # the job will connect to this process's stream listener: one that has
            # stopped admitting fails this start now, naming the listener and why
            self.hub.check_admitting()
            spec = self._job_spec(cfg, process_obj, resources)
            self.job: Job = retry.call(self.backend.name, "create a job",
                                       lambda: submit.create(self.backend, spec),
                                       float(cfg.backend_retry_timeout))
        except BaseException:
            self._done.set()  # no process: a child that connected anyway is not watched
            self._known.set()
            self.hub.remove_channel(self.cid)
            release_transit(self._transit)
            raise
        teardown.hold(self)  # until its backend has freed it (release())
        self.host = self.job.host
        if self.job.pid is not None and self.pid is None:  # (it may have said hello)
            self.pid = self.job.pid
        logger.debug("started %s as %s job %s", self.process_name, self.backend.name, self.job.id)
        # a job connected already is not polled (its connection tells its end)
        monitor_for(self.backend).watch(self.job, self._job_ended, quiet=self._link_up)

    def _job_spec(self, cfg: config.Config, process_obj: ProcessObject,
                  resources: Resources) -> JobSpec:
        env = cfg.child_env()
        env.update({
            "FIBER_BACKEND": cfg.backend,
            "_FIBER_PARENT": self.hub.stream_address,
            "_FIBER_PARENT_HUB": self.hub.address,
            "_FIBER_CHANNEL": str(self.cid),
            "_FIBER_RUN": run.run_id(),
            "PYTHONUNBUFFERED": "1",
        })
        cwd: str | None = os.getcwd()
        self.shipped = ship.wanted(cfg, self.backend)
        if self.shipped:
            # its stub fetches what it needs, then changes to the code's directory
            env.update(ship.job_env(cfg, self.backend, self.hub))
            cwd = None
        # the run's secret travels apart from the environment; the backend delivers it
        # privately, or says its jobs' environments are private (fiber.backend.secrets)
        spec = JobSpec(
            command=run.job_command(cfg, self.backend),
            env=env,
            cwd=cwd,
            image=cfg.image,
            cpu=resources.cpu,
            memory=resources.memory,
            gpu=resources.gpu,
            walltime=resources.walltime,
            extra=resources.extra_for(self.backend.name),
            name=job_name(process_obj.name),
            labels=job_labels(),
            secrets={auth.AUTHKEY_ENV: auth.get_authkey().hex()},
        )
        return secrets.for_backend(self.backend, spec)

    # -- events ---------------------------------------------------------------------
    def connected(self, pid: int, host: str) -> None:
        self._connected = True
        self._link_up = True
        self.pid, self.host = pid, host
        self._known.set()
        job: Job | None = getattr(self, "job", None)
        if job is not None:  # (else it is watched quiet once created: see __init__)
            monitor_for(self.backend).quiet(job)
        self.hub.call_later(beat_interval(self.heartbeat_interval,
                                          self.heartbeat_timeout), self._check_alive)

    def job_python(self) -> str:
        """The interpreter the job runs."""
        return ship.python(self.target.config())

    def _job_id(self) -> str:
        job: Job | None = getattr(self, "job", None)
        return job.id if job is not None else "(being created)"

    def failed_to_prepare(self, text: str) -> None:
        """The bootstrap connected but failed before running the process (importing
        the main module, unpickling the process object); it exits next."""
        job_id = self._job_id()
        text = text.rstrip()
        last = tracebacks.exception_line(text)
        tracebacks.print_once(text)
        self.start_error = ProcessStartError(
            f"{self.process_name}: its {self.backend.name} job {job_id} failed while "
            "preparing to run the process (importing the parent's __main__ module, "
            f"unpickling the process object): {last} (the job's traceback is printed "
            "above, and is this error's logs)", 1, "bootstrap failed", text)
        logger.debug("%s", self.start_error)

    def cannot_run_here(self, text: str) -> None:
        """A shipped job's stub cannot run the process on its host (its Python differs
        from this one's, its cache or disk cannot take the files): it exits next."""
        self.start_error = ProcessStartError(
            f"{self.process_name}: its {self.backend.name} job {self._job_id()} cannot "
            f"run on its host: {text.strip()}", 1, "cannot run on its host", text)
        logger.debug("%s", self.start_error)

    def wrong_version(self, difference: str) -> None:
        """The job runs another fiber, protocol or Python: it is refused (and exits)."""
        job_id = self._job_id()
        self.start_error = ProcessStartError(
            f"{self.process_name}: its {self.backend.name} job {job_id} cannot run this "
            f"process: {difference}. Jobs must run the same fiber version and Python "
            "major.minor as the program (see the python and image settings)",
            None, "version mismatch")

    def _check_alive(self) -> None:
        if self._done.is_set():
            return
        silent = time.monotonic() - self.channel.last_seen
        if silent > self.heartbeat_timeout:
            logger.warning("%s (job %s) has been silent for %.0fs: ending it as lost",
                           self.process_name, self._job_id(), silent)
            self._force_end()
            self._finish(-signal.SIGKILL)
            self._poll_again()  # its final status releases it
            return
        self.hub.call_later(beat_interval(self.heartbeat_interval,
                                          self.heartbeat_timeout), self._check_alive)

    def _force_end(self) -> None:
        if getattr(self, "job", None) is None:
            return  # still being created: its creation's end decides (see __init__)
        try:
            self.backend.terminate(self.job, force=True)
        except Exception:  # noqa: BLE001 - the job may be unreachable
            logger.debug("terminating lost job %s failed", self.job.id, exc_info=True)

    def _poll_again(self, now: bool = False) -> None:
        """The job's monitor polls it again (it was quiet while connected): from its
        next poll, or ``now``."""
        job: Job | None = getattr(self, "job", None)
        monitor = monitor_for(self.backend)
        if now:
            monitor.wake(job)
        elif job is not None:
            monitor.resume(job)

    def connection_lost(self) -> None:
        self._link_up = False
        if self.exit_reported is not None:
            self._finish(self.exit_reported)
        elif self.asked_to_end is not None:
            # it was told to signal itself, and its connection is gone: it has (a
            # job that outlived it would exit anyway once its parent is silent)
            self._finish(self.asked_to_end)
        else:
            self._poll_again(now=True)  # its end is the cluster's to tell
            return
        self._poll_again()  # its final status (which releases it)

    def _job_ended(self, status: JobStatus) -> None:
        if status.state is JobState.LOST and self._trusted_over(status):
            return
        if not self._done.is_set():
            if self.exit_reported is not None:
                code = self.exit_reported
            elif not self._connected and self._end_asked_unconnected is not None:
                code = self._end_asked_unconnected
            elif status.exitcode is not None:
                code = status.exitcode
            elif status.state is JobState.SUCCEEDED:
                code = 0
            else:
                code = -signal.SIGKILL
            if not self._connected and not self._ending and self.start_error is None:
                logs = ""
                try:
                    logs = self.backend.logs(self.job)[-LOG_TAIL:]
                except Exception:  # noqa: BLE001
                    logger.debug("reading logs of job %s failed", self.job.id, exc_info=True)
                reason = f" ({status.reason})" if status.reason else ""
                failure = getattr(self.hub, "failure", None)
                if failure is not None:
                    hint = f" (this process no longer admits its jobs: {failure})"
                elif killed(code):
                    # ended from outside: nothing says the job itself is at fault
                    hint = ", ended from outside"
                elif getattr(self, "shipped", False):
                    hint = (f" (does the job's host have the Python it runs, "
                            f"{self.job_python()!r}? can it reach "
                            f"{self.hub.stream_address}?)")
                else:
                    hint = (" (is fiber-core installed for the job's Python, and can the "
                            f"job reach {self.hub.stream_address}?)")
                self.start_error = ProcessStartError(
                    f"{self.process_name}: its {self.backend.name} job {self.job.id} ended "
                    f"{status.state.value}{reason} with exit code {status.exitcode} before it "
                    f"connected back to this process{hint}"
                    + (f"\n--- job output ---\n{logs}" if logs.strip() else ""),
                    status.exitcode, status.reason, logs)
                if failure is not None:
                    self.start_error.__cause__ = failure
                if killed(code):
                    logger.warning("%s", self.start_error)
                else:
                    logger.error("%s", self.start_error)
            elif self._connected and code != 0 and not self._ending:
                try:  # (one read per job that failed: none at an ordinary end)
                    self.kept_log = self.backend.logs(self.job)[-KEPT_LOG:]
                except Exception:  # noqa: BLE001
                    logger.debug("reading logs of job %s failed", self.job.id, exc_info=True)
            self._finish(code)
        self.release()

    def _trusted_over(self, status: JobStatus) -> bool:
        """A job the cluster says is gone (LOST: it has no record of it, e.g. a
        controller restarted with its state wiped) while it is connected and its
        heartbeat is recent is alive: keep it, and keep watching (its end will be seen
        by its dropped connection, or by a later status)."""
        if self._done.is_set() or not self._link_up or self._ending:
            return False
        if time.monotonic() - self.channel.last_seen >= self.heartbeat_timeout:
            return False
        if not self._distrust_logged:
            self._distrust_logged = True
            first = self.backend.name not in _distrusted
            _distrusted.add(self.backend.name)
            (logger.warning if first else logger.debug)(
                "the %s cluster says job %s (%s) is gone (%s), but it is connected and "
                "its heartbeat is fresh: fiber trusts the job and keeps it (said once for "
                "the backend; the same holds for its other jobs)", self.backend.name,
                self.job.id, self.process_name, status.reason or status.state.value)
        monitor_for(self.backend).watch(self.job, self._job_ended, quiet=True)
        return True

    def _finish(self, code: int) -> None:
        self.output.flush()  # its last words before join() returns
        with self._lock:
            if self._done.is_set():
                return
            self.returncode = code
            self._done.set()
            self._known.set()
            if self._sentinel is not None:
                os.close(self._sentinel[1])
                self._sentinel = (self._sentinel[0], -1)
            callbacks, self._callbacks = self._callbacks, []
        self.hub.remove_channel(self.cid)
        release_transit(self._transit)  # pipe ends it never received
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001
                logger.exception("process end callback failed")

    def add_done_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the process has ended (at once if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def release(self) -> None:
        """Ask the backend to free the job (its container, pod, log file): once its
        final status came, or at exit (:func:`fiber.runtime.teardown.release_all`)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            self.backend.release(self.job)
        except Exception:  # noqa: BLE001
            logger.warning("releasing job %s failed", self.job.id, exc_info=True)
        finally:
            teardown.released(self)

    def write_output(self, stream: bytes, text: str) -> None:
        self.output.write(stream, text)

    # -- the Popen interface --------------------------------------------------------
    def wait_for_pid(self) -> int | None:
        """The job's process id, once it is known: a job whose backend does not name
        it by its pid (a container, a pod) tells it when it connects, so this waits
        until the job runs (or has ended without running: None)."""
        if self.pid is None:
            self._known.wait()
        return self.pid

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self.returncode

    def has_ended(self) -> bool:
        """Whether the job's end is known (for :mod:`fiber.runtime.teardown`)."""
        return self._done.is_set()

    # -- for the group ending (fiber.runtime.teardown) ---------------------------------
    def has_job(self) -> bool:
        """Whether its job exists (its creation has returned)."""
        return getattr(self, "job", None) is not None

    @property
    def is_connected(self) -> bool:
        """Whether the job has said hello (it stays connected in this sense after)."""
        return self._connected

    def mark_ending(self) -> None:
        """Its end was asked for (by terminate(), kill() or the group it belongs to): a
        job that ends before it connected has not failed to start."""
        self._ending = True

    def tell_to_end(self, force: bool) -> None:
        """:meth:`mark_ending`, and a connected job is told to signal itself (SIGKILL
        with ``force``, else SIGTERM) over its own connection; the backend is not asked
        (the caller asks it, for many jobs at once)."""
        self.mark_ending()
        if self._connected:
            self.channel.ask_to_end(force)

    def terminate(self) -> None:
        self._end(False)

    def kill(self) -> None:
        self._end(True)

    def _end(self, force: bool) -> None:
        """SIGTERM (SIGKILL with ``force``): a connected job is told over its own
        connection, and the backend is asked too. A connected job ends whatever the
        cluster manager does, so a backend error is then left to the teardown's retries;
        a job that is not connected yet depends on the backend, whose error is
        raised."""
        if self._done.is_set():
            return
        self._ending = True
        if not self._connected:
            self._end_asked_unconnected = -(signal.SIGKILL if force else signal.SIGTERM)
            self.backend.terminate(self.job, force)
            return
        self.channel.ask_to_end(force)
        teardown.end_jobs([self], force)

    @property
    def sentinel(self) -> int:
        with self._lock:
            if self._sentinel is None:
                r, w = os.pipe()
                if self._done.is_set():
                    os.close(w)
                    w = -1
                self._sentinel = (r, w)
            return self._sentinel[0]

    @property
    def failed_on_its_own(self) -> bool:
        """The job has ended, and not because it was killed from outside: it failed
        or crashed (a traceback before it ran its process, another fiber version, an
        exit status, a crash signal)."""
        if self.returncode is None:
            return False
        if self.start_error is not None and self.start_error.reason in (
                "bootstrap failed", "version mismatch"):
            return True
        return not killed(self.returncode)

    def raise_start_error(self) -> None:
        if self.start_error is not None:
            raise self.start_error

    def close(self) -> None:
        with self._lock:
            if self._sentinel is not None:
                for fd in self._sentinel:
                    if fd >= 0:
                        os.close(fd)
                self._sentinel = None


# backends whose cluster said LOST of a job that was alive (warned once per backend)
_distrusted: set[str] = set()
