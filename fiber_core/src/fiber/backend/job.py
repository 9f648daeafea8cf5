"""The job types shared by the core and every backend.

A backend turns a :class:`JobSpec` into a running :class:`Job` on some cluster and
reports its :class:`JobStatus`. These three types, :class:`Backend` in
:mod:`fiber.backend` and the hooks in :mod:`fiber.backend.hookspecs` are the whole contract a
backend author needs; none of them depends on the rest of fiber.
"""

from __future__ import annotations

import enum
import signal as signals
from dataclasses import dataclass, field
from typing import Any, Literal

from fiber.backend.resources import Resources


class JobState(str, enum.Enum):
    """Where a job is in its life. The first two are live, the others final."""

    PENDING = "pending"  # accepted by the cluster, not running yet (queued, pulling, scheduling)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exited with status 0
    FAILED = "failed"  # exited non-zero, was killed by a signal, OOM-killed, timed out, ...
    CANCELLED = "cancelled"  # ended by terminate() or by someone cancelling it on the cluster
    LOST = "lost"  # the cluster no longer knows it (node failure, host unreachable, deleted)

    @property
    def is_final(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of a job's state.

    ``exitcode`` follows :attr:`multiprocessing.Process.exitcode`: the exit status, or
    the negative signal number when the job's process was killed by a signal (a backend
    that only sees ``128 + N`` from a shell or container runtime reports ``-N``).
    ``reason`` is a short, cluster-specific word for why a job failed or waits, for
    instance ``"OOMKilled"``, ``"TIMEOUT"``, ``"NODE_FAIL"``, ``"Unschedulable"``.
    """

    state: JobState
    exitcode: int | None = None
    reason: str | None = None

    @property
    def is_final(self) -> bool:
        return self.state.is_final

    @staticmethod
    def decode_exitcode(code: int | None,
                        encoding: Literal["exitcode", "shell", "wait"] = "exitcode",
                        ) -> int | None:
        """``code`` as :attr:`exitcode` has it (negative: the killing signal), from
        the way a cluster reports it: ``"exitcode"`` already so; ``"shell"`` as a
        shell or container runtime does (``128 + N`` for death by signal N);
        ``"wait"`` a wait(2) status (exit code in the high byte, signal in the low
        seven bits)."""
        if code is None or encoding == "exitcode":
            return code
        if encoding == "shell":
            return -(code - 128) if 128 < code < 128 + signals.NSIG else code
        if encoding == "wait":
            return -(code & 0x7F) if code & 0x7F else (code >> 8) & 0xFF
        raise ValueError(f"unknown exit code encoding {encoding!r}")

    @classmethod
    def from_exit(cls, exitcode: int | None = None, *, signal: int | None = None,
                  encoding: Literal["exitcode", "shell", "wait"] = "exitcode",
                  cancelled: bool = False, failed: bool = False,
                  reason: str | None = None) -> JobStatus:
        """The status of a job that has ended with ``exitcode`` (decoded from
        ``encoding``, :meth:`decode_exitcode`) or was killed by ``signal``; ``None``
        for both: ended, exit status unknown.

        Exit code 0 is ``SUCCEEDED`` unless ``failed`` (the cluster says the job
        failed although its process exited 0, e.g. killed for memory); anything else
        is ``CANCELLED`` if ``cancelled`` (ended by terminate or by someone on the
        cluster) and ``FAILED`` otherwise. ``reason`` defaults to the signal's name
        (``"SIGKILL"``) for a job killed by a signal."""
        code = -signal if signal else cls.decode_exitcode(exitcode, encoding)
        if code == 0 and not failed:
            return cls(JobState.SUCCEEDED, 0, reason)
        if reason is None and code is not None and code < 0:
            try:
                reason = signals.Signals(-code).name
            except ValueError:
                reason = f"signal {-code}"
        return cls(JobState.CANCELLED if cancelled else JobState.FAILED, code, reason)


@dataclass
class JobSpec:
    """What to run as a job, independent of any cluster.

    ``command`` is an argv list to execute as is (no shell). ``env`` holds the variables
    the job needs on top of what the backend provides (the core puts the connection
    details there; backends must pass them through). ``secrets`` holds variables the
    job needs as well, whose values no one else may see (the core puts the run's
    secret there, ``_FIBER_AUTHKEY``): the backend delivers them so that they become
    environment variables of the job's process without appearing in a command line,
    a stored job description or an environment the cluster shows or keeps, as its
    :attr:`Backend.secrets_delivery` says (:mod:`fiber.backend.secrets`); they are
    left out of the spec's repr, and must never be logged. ``cpu`` is a number of cores (may be fractional), ``memory`` is in
    MiB, ``gpu`` a number of devices, ``walltime`` a number of seconds; ``None`` means
    "no request". ``extra`` holds the requests only this backend knows (its entry of
    :attr:`fiber.backend.Resources.extra`, checked by its
    :meth:`~fiber.backend.Backend.check_resources`); :attr:`resources` gives the typed
    ones as a :class:`~fiber.backend.Resources`. ``labels`` must be
    attached to the job wherever the cluster supports it so that a run's leftovers can
    be found (``fiber.run`` and ``fiber.parent`` are always present). ``image`` is the
    container image for container backends (ignored by others).
    """

    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    image: str | None = None
    cpu: float | None = None
    memory: int | None = None
    gpu: int | None = None
    name: str = "fiber-job"
    labels: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    walltime: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def resources(self) -> Resources:
        """The spec's typed requests as one object (``extra`` stays in :attr:`extra`)."""
        return Resources(cpu=self.cpu, memory=self.memory, gpu=self.gpu,
                         walltime=self.walltime)


@dataclass(eq=False)
class Job:
    """A job a backend created. ``id`` is the cluster's name for it (a pid, a
    container id, a Slurm job id, a pod name). ``host`` is where it runs, if known.
    ``pid`` is the id of the job's process on that host, if the backend knows it when
    it creates the job (the local backend does; others leave it None and the job tells
    it when it connects). ``handle`` is for the backend's private use (a Popen, an SSH channel, ...); the
    core never looks inside it and never sends it to another process."""

    id: str
    backend: str
    spec: JobSpec
    host: str | None = None
    handle: Any = field(default=None, repr=False)
    pid: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["handle"] = None
        return state
