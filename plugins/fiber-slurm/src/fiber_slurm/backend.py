"""The ``slurm`` backend: every fiber job is a Slurm batch job.

A job is submitted with ``sbatch --parsable`` (its batch script, rendered from
``job.sh.template``, goes to sbatch on stdin), watched with one ``squeue`` call for
all of a run's jobs (``scontrol show job`` for the ones squeue no longer lists), ended
with ``scancel`` and its output read from the file named by ``--output`` in
``slurm_log_dir``. The parent may run on a login node: the jobs dial back to the
address :meth:`SlurmBackend.listen_address` finds.

The run's secret (``spec.secrets``) is neither in the batch script nor in the
environment sbatch records (``--export=ALL`` exports sbatch's own environment: the
secrets' names are removed from it): it is written to a secrets file next to the job's
output in ``slurm_log_dir`` (mode 0600 in a 0700 directory, on the filesystem the
compute nodes share), whose path the script exports as ``_FIBER_SECRETS_FILE``. The job
removes the file once read; :meth:`SlurmBackend.release` removes it in any case, and
so does a failed submission.

Many jobs at once (:meth:`SlurmBackend.create_jobs`, a pool's group of workers) are one
*job array* per set of specs that can share one (same command, resources, labels and
working directory): one ``sbatch --array=0-N-1`` whose script gives each task the
environment of its spec (:func:`fiber_slurm.script.render_array`), each with its own
output file (``<name>-<uuid>-<task>.out``) and secrets file next to it. The task
``i`` of array ``A`` is the fiber job ``A_i``: squeue (with ``-r``, so that pending
tasks are listed one by one), scancel and scontrol take that id as they take a job's.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fiber.backend import (
    SECRETS_FILE_ENV,
    Backend,
    BackendError,
    ConfigError,
    Job,
    JobCreationError,
    JobSpec,
    JobState,
    JobStatus,
    Resources,
    write_secrets_file,
)
from fiber_slurm import script
from fiber_slurm.commands import SlurmCommands
from fiber_slurm.options import default_log_dir
from fiber_slurm.states import exitcode_from_pair, exitcode_from_wait_status, to_status

logger = logging.getLogger("fiber.slurm")

#: tasks of one job array at most (Slurm's default MaxArraySize is 1001: ids 0-1000)
MAX_ARRAY = 1000

# squeue --Format fields; Comment last (it is URL-encoded, so it has no "|" anyway).
# JobArrayID: "A_i" for task i of array A, the job id for any other job
_SQUEUE_FIELDS = ("JobArrayID", "State", "Reason", "exit_code", "BatchHost", "STDOUT", "Comment")
_SQUEUE_FORMAT = ",".join(f"{field}:|" for field in _SQUEUE_FIELDS)
_NONE = ("", "(null)", "n/a", "N/A", "None")


def secrets_path(output: str) -> str:
    """The secrets file of the job whose output file is ``output`` (next to it)."""
    base = output[:-len(".out")] if output.endswith(".out") else output
    return base + ".secrets"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@dataclass
class _Handle:
    """What the backend keeps of a job: its output file, its final status once seen
    (Slurm forgets ended jobs after MinJobAge) and whether we cancelled it."""

    output: str | None
    final: JobStatus | None = None
    cancel_signal: int | None = None  # set by terminate()


@dataclass
class _Row:
    job_id: str
    state: str
    reason: str
    exitcode: int | None
    host: str | None
    output: str | None
    comment: str


def _split_id(job_id: str) -> tuple[str, str | None]:
    """``"123;cluster"`` -> ("123", "cluster"); ``"123"`` -> ("123", None)."""
    number, _, cluster = job_id.partition(";")
    return number.strip(), (cluster.strip() or None)


class SlurmBackend(Backend):
    """Jobs as Slurm batch jobs (see the module docstring)."""

    name = "slurm"
    capabilities = frozenset({"logs", "list_jobs", "bulk"})
    secrets_delivery = "private"  # a 0600 file next to the job's output (see above)
    resource_fields = frozenset({"cpu", "memory", "gpu", "walltime"})
    resource_extras = script.RESOURCE_EXTRAS

    def check_resources(self, resources: Resources) -> None:
        """The default checks, then: a GPU request needs a node that offers a GPU
        generic resource (``sinfo``'s GRES column), else it would wait forever."""
        super().check_resources(resources)
        if resources.gpu:
            done = self.commands.run("sinfo", ["-h", "-o", "%G"])
            offered = done.stdout if done.returncode == 0 else ""
            if "gpu" not in offered:
                raise ConfigError(
                    f"the slurm backend cannot honour a gpu request ({resources.gpu}): no "
                    f"node of this cluster offers a gpu generic resource (sinfo -o %G: "
                    f"{offered.split() or 'none'}); drop the request or use a cluster "
                    "with GPUs")

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        self.poll_interval = float(options.get("slurm_poll_interval") or 1.0)
        self.commands = SlurmCommands(options.get("slurm_bin_dir"))
        self.log_dir = os.path.abspath(os.path.expanduser(
            options.get("slurm_log_dir") or default_log_dir()))
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._address: str | None = None

    # -- creating -----------------------------------------------------------------
    def _output_path(self, spec: JobSpec) -> str:
        os.makedirs(self.log_dir, mode=0o700, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)[:60] or "job"
        return os.path.join(self.log_dir, f"{safe}-{uuid.uuid4().hex[:12]}.out")

    def create_job(self, spec: JobSpec) -> Job:
        output = self._output_path(spec)
        secrets = secrets_path(output) if spec.secrets else None
        try:
            job_id, stderr = self._submit(spec, output, secrets)
        except BaseException:
            if secrets is not None:
                _unlink(secrets)
            raise
        if stderr.strip():
            logger.info("sbatch (job %s): %s", job_id, stderr.strip())
        job = Job(id=job_id, backend=self.name, spec=spec, handle=_Handle(output))
        with self._lock:
            self._jobs[job.id] = job
        logger.debug("submitted job %s (%s) to Slurm", job_id, spec.name)
        return job

    def _submit(self, spec: JobSpec, output: str, secrets: str | None) -> tuple[str, str]:
        """sbatch the job; its id and sbatch's stderr."""
        env = None
        if secrets is not None:
            write_secrets_file(secrets, spec.secrets)
            env = self._sbatch_env(spec.secrets)
            spec = replace(spec, env={**spec.env, SECRETS_FILE_ENV: secrets}, secrets={})
        batch = script.render(spec, self.options, output)
        return self._sbatch(batch, env, f"job {spec.name}")

    @staticmethod
    def _sbatch_env(names: Mapping[str, str] | set[str]) -> dict[str, str]:
        """sbatch's environment: --export=ALL records it, so never a secret in it
        (this process may be a job of the run, which holds the secret in its own)."""
        return {k: v for k, v in os.environ.items() if k not in names}

    def _sbatch(self, batch: str, env: dict[str, str] | None, what: str) -> tuple[str, str]:
        """Submit ``batch``; the job id and sbatch's stderr."""
        done = self.commands.run("sbatch", ["--parsable"], stdin=batch, env=env)
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}"
            raise JobCreationError(f"sbatch refused {what}: {message}")
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        if not lines or not re.fullmatch(r"\d+(_\d+)?(;\S+)?", lines[-1].strip()):
            raise JobCreationError(
                f"cannot read a job id in sbatch's output for {what}: "
                f"{done.stdout.strip()!r} {done.stderr.strip()!r}")
        return lines[-1].strip(), done.stderr

    # -- creating in bulk: job arrays -------------------------------------------------
    @staticmethod
    def _array_key(spec: JobSpec) -> tuple[Any, ...]:
        """What the tasks of one array share: all but the environment and the name."""
        return (tuple(spec.command), spec.cwd, spec.cpu, spec.memory, spec.gpu,
                tuple(sorted(spec.labels.items())))

    def create_jobs(self, specs: Sequence[JobSpec]) -> list[Job | BaseException]:
        """One job array (one ``sbatch``) per set of specs that can share one, up to
        :data:`MAX_ARRAY` tasks; a spec alone is a plain job. A refused array is the
        error of each of its specs."""
        outcomes: list[Job | BaseException | None] = [None] * len(specs)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, spec in enumerate(specs):
            groups.setdefault(self._array_key(spec), []).append(index)
        for indices in groups.values():
            for start in range(0, len(indices), MAX_ARRAY):
                chunk = indices[start:start + MAX_ARRAY]
                try:
                    if len(chunk) == 1:
                        made = [self.create_job(specs[chunk[0]])]
                    else:
                        made = self._create_array([specs[i] for i in chunk])
                except Exception as exc:  # noqa: BLE001 - each spec's outcome
                    for index in chunk:
                        outcomes[index] = exc
                    continue
                for index, job in zip(chunk, made, strict=True):
                    outcomes[index] = job
        return [outcome if outcome is not None else
                BackendError(f"job {specs[i].name} was not submitted")
                for i, outcome in enumerate(outcomes)]

    def _create_array(self, specs: Sequence[JobSpec]) -> list[Job]:
        pattern = self._output_path(specs[0])[:-len(".out")] + "-%a.out"
        outputs = [pattern.replace("%a", str(index)) for index in range(len(specs))]
        secret_names: set[str] = set()
        written: list[str] = []
        try:
            tasks = []
            for spec, output in zip(specs, outputs, strict=True):
                if spec.secrets:
                    path = secrets_path(output)
                    written.append(path)
                    write_secrets_file(path, spec.secrets)
                    secret_names.update(spec.secrets)
                    spec = replace(spec, env={**spec.env, SECRETS_FILE_ENV: path},
                                   secrets={})
                tasks.append(spec)
            batch = script.render_array(tasks, self.options, pattern)
            env = self._sbatch_env(secret_names) if secret_names else None
            array_id, stderr = self._sbatch(
                batch, env, f"the job array of {len(specs)} jobs ({specs[0].name}, ...)")
        except BaseException:
            for path in written:
                _unlink(path)
            raise
        if stderr.strip():
            logger.info("sbatch (job array %s): %s", array_id, stderr.strip())
        number, cluster = _split_id(array_id)
        jobs = [Job(id=f"{number}_{index}" + (f";{cluster}" if cluster else ""),
                    backend=self.name, spec=spec, handle=_Handle(output))
                for index, (spec, output) in enumerate(zip(specs, outputs, strict=True))]
        with self._lock:
            for job in jobs:
                self._jobs[job.id] = job
        logger.debug("submitted job array %s of %d jobs (%s, ...) to Slurm", array_id,
                     len(jobs), specs[0].name)
        return jobs

    # -- watching -----------------------------------------------------------------
    def _handle(self, job: Job) -> _Handle:
        if not isinstance(job.handle, _Handle):
            with self._lock:
                known = self._jobs.get(job.id)
            job.handle = known.handle if known is not None else _Handle(None)
        return job.handle

    def _squeue(self, ids: Sequence[str]) -> dict[str, _Row]:
        """One squeue call for the given job ids (all states, so recently ended jobs
        still in slurmctld's memory are included)."""
        rows: dict[str, _Row] = {}
        by_cluster: dict[str | None, list[str]] = {}
        for job_id in ids:
            number, cluster = _split_id(job_id)
            # a task of an array: the array's id lists all its tasks (one per line, -r)
            by_cluster.setdefault(cluster, []).append(number.partition("_")[0])
        for cluster, numbers in by_cluster.items():
            args = ["-h", "-r", "-t", "all", "-j", ",".join(dict.fromkeys(numbers)),
                    "-O", _SQUEUE_FORMAT]
            if cluster:
                args[:0] = ["-M", cluster]
            done = self.commands.run("squeue", args)
            if done.returncode != 0 and "invalid job id" not in done.stderr.lower():
                raise BackendError(f"squeue failed: {done.stderr.strip()}")
            for row in self._parse_rows(done.stdout):
                key = f"{row.job_id};{cluster}" if cluster else row.job_id
                rows[key] = row
        return rows

    @staticmethod
    def _parse_rows(text: str) -> list[_Row]:
        rows = []
        for line in text.splitlines():
            parts = line.split("|")
            if len(parts) < len(_SQUEUE_FIELDS) or line.startswith("CLUSTER:"):
                continue
            job_id, state, reason, code, host, output, comment = (
                p.strip() for p in parts[:len(_SQUEUE_FIELDS)])
            array, _, task = job_id.partition("_")
            if output and task.isdigit():  # squeue shows an array's --output pattern
                output = output.replace("%a", task).replace("%A", array)
            try:
                exitcode = exitcode_from_wait_status(int(code))
            except ValueError:
                exitcode = None
            rows.append(_Row(job_id, state, reason, exitcode,
                             None if host in _NONE else host,
                             None if output in _NONE else output, comment))
        return rows

    def _scontrol(self, job_id: str, cancel_signal: int) -> JobStatus | None:
        """A job squeue did not list, from ``scontrol show job`` (None if unknown)."""
        number, cluster = _split_id(job_id)
        args = ["-o", "show", "job", number]
        if cluster:
            args[:0] = ["-M", cluster]
        done = self.commands.run("scontrol", args)
        if done.returncode != 0:
            return None
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        if "JobState" not in fields:
            return None
        return to_status(fields["JobState"], exitcode_from_pair(fields.get("ExitCode", "")),
                         fields.get("Reason"), cancel_signal)

    def _finish(self, job: Job, status: JobStatus) -> JobStatus:
        handle = self._handle(job)
        if status.is_final:
            if handle.cancel_signal and status.state is JobState.FAILED:
                status = replace(status, state=JobState.CANCELLED)
            handle.final = status
        return status

    def poll(self, jobs: Sequence[Job]) -> dict[str, JobStatus]:
        result: dict[str, JobStatus] = {}
        todo = []
        for job in jobs:
            final = self._handle(job).final
            if final is not None:
                result[job.id] = final
            else:
                todo.append(job)
        if not todo:
            return result
        rows = self._squeue([job.id for job in todo])
        for job in todo:
            row = rows.get(job.id)
            if row is not None:
                if row.host:
                    job.host = row.host
                if row.output and not self._handle(job).output:
                    self._handle(job).output = row.output  # a job this instance did not submit
                status = to_status(row.state, row.exitcode, row.reason,
                                   self._handle(job).cancel_signal or signal.SIGTERM)
            elif (cancelled := self._handle(job).cancel_signal) and "_" in job.id:
                # a pending array task we cancelled: Slurm drops it from its listings
                status = JobStatus(JobState.CANCELLED, -cancelled, "cancelled while pending")
            else:
                status = self._scontrol(
                    job.id, self._handle(job).cancel_signal or signal.SIGTERM) or JobStatus(
                    JobState.LOST, None,
                    "unknown to Slurm (purged after MinJobAge, or never existed)")
            result[job.id] = self._finish(job, status)
        return result

    def status(self, job: Job) -> JobStatus:
        return self.poll([job])[job.id]

    # -- ending ---------------------------------------------------------------------
    def terminate(self, job: Job, force: bool = False) -> None:
        handle = self._handle(job)
        if handle.final is not None:
            return
        handle.cancel_signal = signal.SIGKILL if force else signal.SIGTERM
        number, cluster = _split_id(job.id)
        prefix = ["-M", cluster] if cluster else []
        if force:
            # SIGKILL to the batch step, which is the exec'd command itself, so the job
            # ends with signal 9 at once; a pending job is cancelled. (A plain
            # `scancel --signal=KILL` is turned into a cancel that sends SIGTERM first.)
            self._scancel(job, prefix, ["--batch", "--signal=KILL"], number)
        # cancel: marks the job CANCELLED if Slurm has not seen it end yet, SIGTERM to
        # every process left in the job, SIGKILL after KillWait
        self._scancel(job, prefix, [], number)

    def terminate_jobs(self, jobs: Sequence[Job], force: bool = False
                       ) -> dict[str, BaseException]:
        """One ``scancel`` of every job id per cluster (two with ``force``: the
        batch steps' SIGKILL, then the cancel), instead of one call per job."""
        by_cluster: dict[str | None, list[Job]] = {}
        for job in jobs:
            handle = self._handle(job)
            if handle.final is not None:
                continue
            handle.cancel_signal = signal.SIGKILL if force else signal.SIGTERM
            by_cluster.setdefault(_split_id(job.id)[1], []).append(job)
        errors: dict[str, BaseException] = {}
        for cluster, group in by_cluster.items():
            prefix = ["-M", cluster] if cluster else []
            numbers = [_split_id(job.id)[0] for job in group]
            try:
                if force:
                    self._scancel_many(prefix, ["--batch", "--signal=KILL"], numbers)
                self._scancel_many(prefix, [], numbers)
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                for job in group:
                    errors[job.id] = exc
        return errors

    def _scancel_many(self, prefix: list[str], flags: list[str],
                      numbers: list[str]) -> None:
        # scancel ends every id it can and complains about the others (already
        # ended: "Invalid job id specified"), which is no error here
        done = self.commands.run("scancel", [*prefix, *flags, *numbers])
        if done.returncode != 0:
            logger.debug("scancel %s of %d jobs: %s", " ".join(flags), len(numbers),
                         done.stderr.strip())

    def _scancel(self, job: Job, prefix: list[str], flags: list[str], number: str) -> None:
        done = self.commands.run("scancel", [*prefix, *flags, number])
        if done.returncode != 0:  # typically: the job has already ended
            logger.debug("scancel %s %s: %s", " ".join(flags), job.id, done.stderr.strip())

    def logs(self, job: Job) -> str:
        output = self._handle(job).output
        if not output:
            return ""
        try:
            with open(output, "rb") as log:
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def release(self, job: Job) -> None:
        handle = self._handle(job)
        if handle.final is None and not self.status(job).is_final:
            logger.debug("not releasing job %s: it has not ended", job.id)
            return
        if handle.output:
            _unlink(handle.output)
            _unlink(secrets_path(handle.output))  # (the job removed it once read)
        with self._lock:
            self._jobs.pop(job.id, None)

    # -- finding --------------------------------------------------------------------
    def list_jobs(self, labels: Mapping[str, str]) -> list[Job]:
        """This user's fiber jobs whose labels include ``labels`` and that Slurm still
        holds: live ones, and ended ones whose output file was not released yet."""
        args = ["-h", "-r", "-t", "all", "--me", "-O", _SQUEUE_FORMAT]
        if "fiber.run" in labels:
            args += ["-n", script.job_name(labels)]
        done = self.commands.run("squeue", args)
        if done.returncode != 0:
            raise BackendError(f"squeue failed: {done.stderr.strip()}")
        jobs = []
        for row in self._parse_rows(done.stdout):
            found = script.decode_comment(row.comment)
            if found is None or any(found.get(k) != v for k, v in labels.items()):
                continue
            status = to_status(row.state, row.exitcode, row.reason)
            if status.is_final and not (row.output and os.path.exists(row.output)):
                continue
            name = found.pop(script.NAME_LABEL, "fiber-job")
            spec = JobSpec(command=[], name=name, labels=found)
            with self._lock:
                known = self._jobs.get(row.job_id)
            handle = known.handle if known is not None else _Handle(row.output)
            jobs.append(Job(id=row.job_id, backend=self.name, spec=spec, host=row.host,
                            handle=handle))
        return jobs

    # -- networking -----------------------------------------------------------------
    def listen_address(self) -> str:
        """The address of this host on the route to slurmctld (compute nodes reach
        the submit host the same way), else the address of this host's name."""
        if self._address is None:
            self._address = self._find_address()
        return self._address

    def _controller_address(self) -> str | None:
        done = self.commands.run("scontrol", ["show", "config"])
        match = re.search(r"^SlurmctldHost\[0\]\s*=\s*(\S+)", done.stdout, re.MULTILINE)
        if not match:
            return None
        host = match.group(1)
        inner = re.fullmatch(r"([^(]+)\(([^)]+)\)", host)
        return inner.group(2) if inner else host

    def _find_address(self) -> str:
        try:
            controller = self._controller_address()
        except BackendError:
            controller = None
        if controller:
            try:
                info = socket.getaddrinfo(controller, 6817, type=socket.SOCK_DGRAM)[0]
                with socket.socket(info[0], socket.SOCK_DGRAM) as probe:
                    probe.connect(info[4])  # UDP connect: picks a route, sends nothing
                    return probe.getsockname()[0]
            except OSError as exc:
                logger.debug("no route to slurmctld host %s: %s", controller, exc)
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    def close(self) -> None:
        with self._lock:
            self._jobs.clear()
