"""The job interface every backend implements, and the errors it raises.

Modelled on multiprocessing's Popen classes: the API layer (``fiber.Process``,
``fiber.Pool``, ...) talks only to this interface; each backend is one small adapter
behind it. A backend instance is created once per process per backend name, with the
effective settings (a plain mapping of option name to typed value, see
:func:`fiber.backend.hookspecs.fiber_config_options`), and must be safe to call from several
threads at once.

Errors say whether trying again may help. :class:`TransientBackendError` (and its
subclass :class:`ClusterUnreachableError`) means "not now": the cluster manager is down,
restarting, overloaded (an HTTP 500 or 429, a scheduler's time-out, a dropped
connection); the core retries the call with backoff and jitter for up to the
``backend_retry_timeout`` setting (default 180 s), logging one warning per outage, and
a pool keeps its size meanwhile. :class:`JobCreationError` means "never": a bad
request, a missing image, no permission; the core fails at once with its message, so
that message should say what to do. Any other exception counts as permanent too.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fiber import threads
from fiber.backend.job import Job, JobSpec, JobStatus
from fiber.backend.resources import Resources
from fiber.errors import (
    BackendError,
    ClusterUnreachableError,
    ConfigError,
    JobCreationError,
    TransientBackendError,
)

__all__ = ["CAPABILITIES", "REQUIRED", "Backend", "BackendError", "ClusterUnreachableError",
           "JobCreationError", "TransientBackendError"]

#: The optional parts of the contract, by the name a backend declares in
#: :attr:`Backend.capabilities`. The contract suite (:mod:`fiber.testing`) tests what is
#: declared and skips the rest, saying which capability was not declared.
CAPABILITIES: dict[str, str] = {
    "logs": ":meth:`Backend.logs` returns what a job wrote to stdout and stderr",
    "list_jobs": ":meth:`Backend.list_jobs` finds the jobs other processes created "
                 "(what `fiber jobs` and `fiber clean` need)",
    "bulk": ":meth:`Backend.create_jobs` / :meth:`Backend.terminate_jobs` act on many "
            "jobs in fewer calls than one per job (a job array, one delete by label)",
    "images": "jobs run in container images (the image setting): `fiber run --build` "
              "makes the program's image with an image builder and runs it there",
    "secrets": "the run's secret reaches a job through a private channel, not its "
               "environment (declared by secrets_delivery = 'private', not in the set)",
}


class Backend(abc.ABC):
    """Create, watch and end jobs on one kind of cluster.

    Required (:data:`REQUIRED`): :meth:`create_job`, :meth:`status`,
    :meth:`terminate`, and :attr:`secrets_delivery` (without it no fiber process
    could run on the backend; the registry refuses a class that lacks any of them,
    naming what is missing).
    Optional, with working defaults: :meth:`poll` (batch status; override it when the
    cluster can answer for many jobs in one call), :meth:`create_jobs` and
    :meth:`terminate_jobs` (the same for starting and ending many jobs), :meth:`wait`,
    :meth:`logs`,
    :meth:`listen_address`, :meth:`expect_jobs`, :meth:`release`, :meth:`list_jobs`,
    :meth:`close`. Which optional parts a backend really implements, it declares in
    :attr:`capabilities`.
    """

    #: the name users select the backend by (``FIBER_BACKEND=name``)
    name: str = ""
    #: seconds between two status polls of the core's job monitor for this backend
    poll_interval: float = 1.0
    #: seconds a job's last output may take to reach :meth:`logs` after its end is
    #: known (a cluster's log store); ``fiber run`` reads the logs until they have not
    #: grown for that long. 0 for a backend whose logs are complete when the job ends.
    logs_lag: float = 2.0
    #: whether :meth:`list_jobs` finds the jobs that other processes created (what the
    #: CLI's ``fiber jobs`` and ``fiber clean`` need); False when it knows only this
    #: instance's jobs, and then the CLI says it cannot list them
    lists_others_jobs: bool = True
    #: calls to the cluster manager the default :meth:`create_jobs` and
    #: :meth:`terminate_jobs` make at once
    max_parallel_calls: int = 16
    #: how :meth:`create_job` delivers ``JobSpec.secrets`` (the run's secret) to the
    #: job (:mod:`fiber.backend.secrets`): ``"private"`` (the backend delivers them
    #: itself, through its engine's secret mechanism or a private channel, e.g. a
    #: secrets file), ``"env"`` (the core merges them into ``env``: only for a backend
    #: whose jobs' environments are readable by the job's user and root alone, and
    #: never stored or shown by the cluster). Required: a class that leaves it ``None``
    #: is refused when the backend is resolved, as one missing a required method is
    #: (no fiber process could run on it: it would have no way to join its run)
    secrets_delivery: str | None = None
    #: whether this backend's jobs see this machine's files at the same paths (its
    #: Python, the packages installed for it, the program's code): then the core runs
    #: ``<python> -m fiber.runtime.bootstrap`` in them as it is. False: the core ships
    #: what the jobs need under the ``ship`` setting's default, ``auto``
    #: (:mod:`fiber.runtime.ship`), and its jobs need only a Python interpreter
    shares_files: bool = True
    #: the optional capabilities this backend implements (names of
    #: :data:`CAPABILITIES`). A subclass that does not set it declares ``logs`` and
    #: ``list_jobs`` by overriding :meth:`logs` and :meth:`list_jobs` (with
    #: :attr:`lists_others_jobs` true); set it to say exactly what the backend does.
    #: ``secrets`` follows :attr:`secrets_delivery` (``"private"``) and is not set here.
    capabilities: frozenset[str] = frozenset()
    #: the typed requests of :class:`Resources` this backend honours (the default
    #: :meth:`check_resources` refuses a ``gpu`` or ``walltime`` request not named here)
    resource_fields: frozenset[str] = frozenset({"cpu", "memory"})
    #: the keys of its own ``Resources.extra[name]`` entry it understands (what goes
    #: to :attr:`JobSpec.extra`)
    resource_extras: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "capabilities" in cls.__dict__:
            unknown = set(cls.capabilities) - set(CAPABILITIES)
            if unknown:
                raise TypeError(f"{cls.__name__}.capabilities names unknown capabilities "
                                f"{sorted(unknown)}; known: {sorted(CAPABILITIES)}")
            if "secrets" in cls.capabilities:
                raise TypeError(f"{cls.__name__}.capabilities: 'secrets' follows "
                                "secrets_delivery = 'private'; do not declare it")
            declared = set(cls.capabilities)
        else:
            declared = set(cls.capabilities) - {"secrets"}
            if cls.logs is not Backend.logs:
                declared.add("logs")
            if cls.list_jobs is not Backend.list_jobs and cls.lists_others_jobs:
                declared.add("list_jobs")
        if cls.secrets_delivery == "private":
            declared.add("secrets")
        cls.capabilities = frozenset(declared)

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = options

    # -- required -----------------------------------------------------------------
    @abc.abstractmethod
    def create_job(self, spec: JobSpec) -> Job:
        """Start ``spec`` on the cluster and return at once (do not wait for it to
        run). Raise :class:`JobCreationError` when the cluster refuses the job for
        good, :class:`TransientBackendError` (or :class:`ClusterUnreachableError`)
        when asking again later may work (the core retries those), with a message
        that says what to do. A call that raised must not leave a job behind."""

    @abc.abstractmethod
    def status(self, job: Job) -> JobStatus:
        """The job's current status."""

    @abc.abstractmethod
    def terminate(self, job: Job, force: bool = False) -> None:
        """End the job: SIGTERM-like by default, SIGKILL-like with ``force``. Must not
        raise when the job has already ended."""

    # -- optional -----------------------------------------------------------------
    def create_jobs(self, specs: Sequence[JobSpec]) -> list[Job | BaseException]:
        """Start many jobs (a pool's group of workers) and return, in the order of
        ``specs``, each one's :class:`Job` or the exception its creation raised (as
        :meth:`create_job` would have: :class:`TransientBackendError` for what the core
        may retry, anything else for good). The default calls :meth:`create_job` for
        each spec, :attr:`max_parallel_calls` at a time; a cluster that can create many
        jobs in one request (a Slurm job array) overrides it and declares ``bulk``."""
        return _each(self, specs, self.create_job)

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        """Statuses of many jobs, keyed by ``job.id``. The core calls this every
        :attr:`poll_interval` seconds for all live jobs of a run, so a backend whose
        cluster answers for many jobs at once (one ``squeue``, one watch) should
        override it. When the cluster cannot answer, raise (any exception): the core
        keeps the jobs' last known state and polls again later; report
        :attr:`JobState.LOST` only for a job the cluster says is gone."""
        return {job.id: self.status(job) for job in jobs}

    def terminate_jobs(self, jobs: Sequence[Job], force: bool = False
                       ) -> dict[str, BaseException]:
        """End many jobs (a pool's workers), as :meth:`terminate` each; return the
        errors of those that could not be ended now, keyed by ``job.id`` (an empty
        dict when all were). The core calls it whenever it ends a group of jobs, so a
        cluster that can end many jobs in one request (one ``scancel`` of many ids, a
        delete by label) should override it. The default calls :meth:`terminate` for
        each job, :attr:`max_parallel_calls` at a time. A job that has already ended
        is no error."""
        outcomes = _each(self, jobs, lambda job: self.terminate(job, force))
        return {job.id: outcome for job, outcome in zip(jobs, outcomes, strict=True)
                if isinstance(outcome, BaseException)}

    def wait(self, job: Job, timeout: float | None = None) -> JobStatus | None:
        """Block until the job has ended and return its final status, or ``None`` on
        timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.01
        while True:
            status = self.status(job)
            if status.is_final:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pause = min(delay, self.poll_interval)
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
            delay *= 2

    def logs(self, job: Job) -> str:
        """What the job wrote to its stdout and stderr, as far as the cluster kept it."""
        return ""

    def check_resources(self, resources: Resources) -> None:
        """Refuse, with :class:`fiber.errors.ConfigError` saying why, a resource request
        this backend cannot honour. The core calls it before it starts any job with
        ``resources`` (a Process's, each Pool's once); a backend whose cluster can say
        more (no GPU anywhere, no such partition) overrides it and calls this one. The
        default accepts the typed requests named in :attr:`resource_fields` and the
        keys of :attr:`resource_extras` in ``resources.extra[self.name]``; other
        backends' entries of ``extra`` are not its business."""
        for name in ("cpu", "memory", "gpu", "walltime"):
            value = getattr(resources, name)
            if value and name not in self.resource_fields:
                raise ConfigError(
                    f"the {self.name} backend cannot honour a {name} request ({value!r}); "
                    f"it honours {', '.join(sorted(self.resource_fields)) or 'none'}: drop "
                    "the request or use a backend that can")
        unknown = sorted(set(resources.extra.get(self.name, {})) - set(self.resource_extras))
        if unknown:
            known = ", ".join(sorted(self.resource_extras)) or "none"
            raise ConfigError(
                f"the {self.name} backend does not know the resource request "
                f"extra[{self.name!r}][{unknown[0]!r}] (it knows: {known})")

    def listen_address(self) -> str:
        """The address of this machine that jobs of this backend can connect to. The
        core binds its listening sockets there unless the user sets
        ``listen_address``."""
        return "127.0.0.1"

    def expect_jobs(self, command: Sequence[str]) -> None:
        """Called once in a program's main process when it prepares to create jobs (it
        opens its listening socket), before the first :meth:`create_job`, with the
        command fiber's jobs will run (as :attr:`JobSpec.command`): a backend may start
        now what its jobs will need, in parallel with the rest of the set-up."""
        return None

    def release(self, job: Job) -> None:
        """Free what the cluster keeps of an ended job (remove a container, a pod, a
        log file). Called once by the core after it has read the final status and
        the logs it needs; must not raise when nothing is left."""
        return None

    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        """The jobs on the cluster whose labels include ``labels`` (for the CLI's
        ``fiber jobs`` and ``fiber clean``, which call it in a process of their own:
        the jobs must be found on the cluster, not in this instance's memory, and
        :meth:`status`, :meth:`terminate` and :meth:`release` must work on the jobs it
        returns). A backend that does not override it, or whose
        :attr:`lists_others_jobs` is False, cannot list them for the CLI, which says
        so."""
        return []

    def close(self) -> None:
        """Release connections and threads. The backend is not used afterwards."""
        return None


#: The required parts of the contract: :class:`Backend`'s abstract methods and the
#: attribute every backend sets (the registry refuses a backend class without them,
#: naming what is missing); everything else of :class:`Backend` is optional, with a
#: working default.
REQUIRED: tuple[str, ...] = (*sorted(Backend.__abstractmethods__), "secrets_delivery")


def _each(backend: Backend, items: Sequence[Any], call: Any) -> list[Any]:
    """``call(item)`` for each item, :attr:`Backend.max_parallel_calls` at a time, in
    daemon threads (not an executor's, which the interpreter waits for at exit: a call
    that hangs on a cluster that does not answer must not hold the exit); each result,
    or the exception it raised, in the order of ``items``."""
    results: list[Any] = [None] * len(items)

    def one(index: int) -> None:
        try:
            results[index] = call(items[index])
        except Exception as exc:  # noqa: BLE001 - returned to the caller
            results[index] = exc

    if len(items) <= 1:
        for index in range(len(items)):
            one(index)
        return results
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def caller() -> None:
        while True:
            with lock:
                index = next(todo, None)
            if index is None:
                return
            one(index)

    def died(error: BaseException) -> None:
        # the items no caller will take fail with the cause (not None: "no result")
        while True:
            with lock:
                index = next(todo, None)
            if index is None:
                return
            results[index] = error

    callers = [threads.start("fiber-call", caller, name=f"fiber-call-{backend.name}",
                             fails=died)
               for _ in range(min(len(items), max(1, backend.max_parallel_calls)))]
    for thread in callers:
        thread.join()
    return results
