"""The ``slurm`` backend: every fiber job is a Slurm batch job.

What any batch scheduler does (output and secrets files, job arrays, polling,
cancelling) is :class:`fiber.backend.batch.BatchBackend`'s; this module holds Slurm's
verbs and words.

A job is submitted with ``sbatch --parsable`` (its batch script, rendered by
:mod:`fiber_slurm.script`, goes to sbatch on stdin), watched with one ``squeue`` call for
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
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fiber.backend import BackendError, ConfigError, Job, JobSpec, JobStatus, Resources
from fiber.backend.batch import BatchBackend, QueueRow, secrets_path
from fiber_slurm import script
from fiber_slurm.commands import SlurmCommands
from fiber_slurm.options import default_log_dir
from fiber_slurm.states import (
    exitcode_from_pair,
    exitcode_from_wait_status,
    may_still_run,
    to_status,
)

__all__ = ["MAX_ARRAY", "SlurmBackend", "secrets_path"]

logger = logging.getLogger("fiber.slurm")

#: seconds between the SIGKILLs of a forced cancel to a job Slurm still lists as running
KILL_AGAIN = 0.25

#: tasks of one job array at most (Slurm's default MaxArraySize is 1001: ids 0-1000)
MAX_ARRAY = 1000

# squeue --Format fields; Comment last (it is URL-encoded, so it has no "|" anyway).
# JobArrayID: "A_i" for task i of array A, the job id for any other job
_SQUEUE_FIELDS = ("JobArrayID", "State", "Reason", "exit_code", "BatchHost", "STDOUT", "Comment")
_SQUEUE_FORMAT = ",".join(f"{field}:|" for field in _SQUEUE_FIELDS)
_NONE = ("", "(null)", "n/a", "N/A", "None")


def _by_cluster(jobs: Sequence[Job]) -> list[tuple[list[str], list[str]]]:
    """``[(scancel's cluster arguments, job numbers), ...]``, one per cluster."""
    groups: dict[str | None, list[str]] = {}
    for job in jobs:
        number, cluster = _split_id(job.id)
        groups.setdefault(cluster, []).append(number)
    return [(["-M", cluster] if cluster else [], numbers) for cluster, numbers in groups.items()]


def _split_id(job_id: str) -> tuple[str, str | None]:
    """``"123;cluster"`` -> ("123", "cluster"); ``"123"`` -> ("123", None)."""
    number, _, cluster = job_id.partition(";")
    return number.strip(), (cluster.strip() or None)


class SlurmBackend(BatchBackend):
    """Jobs as Slurm batch jobs (see the module docstring)."""

    name = "slurm"
    capabilities = frozenset({"logs", "list_jobs", "bulk"})
    resource_fields = frozenset({"cpu", "memory", "gpu", "walltime"})
    resource_extras = script.RESOURCE_EXTRAS
    # "123", an array's task "123_4", with ";cluster" on a multi-cluster setup
    job_id_pattern = re.compile(r"\d+(_\d+)?(;\S+)?")
    submit_name = "sbatch"
    max_array = MAX_ARRAY
    array_index_token = "%a"
    lost_reason = "unknown to Slurm (purged after MinJobAge, or never existed)"

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
        super().__init__(options, options.get("slurm_log_dir") or default_log_dir())
        self.poll_interval = float(options.get("slurm_poll_interval") or 1.0)
        self.commands = SlurmCommands(options.get("slurm_bin_dir"))
        self._address: str | None = None
        self._launch_timeout: float | None = None

    # -- the scheduler's verbs (BatchBackend) ----------------------------------------
    def run_submit(self, script: str, env: dict[str, str] | None
                   ) -> subprocess.CompletedProcess[str]:
        done: subprocess.CompletedProcess[str] = self.commands.run(
            "sbatch", ["--parsable"], stdin=script, env=env)
        return done

    def render(self, spec: JobSpec, output: str) -> str:
        return script.render(spec, self.options, output)

    def render_array(self, specs: Sequence[JobSpec], output: str) -> str:
        return script.render_array(specs, self.options, output)

    def array_task_id(self, array_id: str, index: int) -> str:
        number, cluster = _split_id(array_id)
        return f"{number}_{index}" + (f";{cluster}" if cluster else "")

    def query(self, job_ids: Sequence[str]) -> dict[str, QueueRow]:
        """One squeue call for the given job ids (all states, so recently ended jobs
        still in slurmctld's memory are included)."""
        rows: dict[str, QueueRow] = {}
        by_cluster: dict[str | None, list[str]] = {}
        for job_id in job_ids:
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

    def row_status(self, row: QueueRow, cancel_signal: int) -> JobStatus:
        return to_status(row.state, row.exitcode, row.reason, cancel_signal)

    def ended_status(self, job: Job, cancel_signal: int) -> JobStatus | None:
        if self.handle(job).cancel_signal and "_" in job.id:
            # a pending array task we cancelled: Slurm drops it from its listings
            return JobStatus.from_exit(signal=cancel_signal, cancelled=True,
                                       reason="cancelled while pending")
        return self._scontrol(job.id, cancel_signal)

    def cancel(self, jobs: Sequence[Job], force: bool) -> None:
        """One ``scancel`` of every job id per cluster: Slurm's cancel (SIGTERM to every
        process of the job, SIGKILL after KillWait). With ``force``: SIGKILL, and only
        SIGKILL (:meth:`_kill`)."""
        if force:
            self._kill(jobs)
            return
        for prefix, numbers in _by_cluster(jobs):
            self._scancel(prefix, [], numbers)

    def _kill(self, jobs: Sequence[Job]) -> None:
        """SIGKILL ``jobs`` with ``scancel --batch --signal=KILL``: to the batch step,
        which is the exec'd command itself, so a running job ends with signal 9 at once
        (Slurm records it FAILED, ExitCode 0:9); a pending job is cancelled. Slurm lists
        a job RUNNING from its allocation on, before slurmd has launched its batch step,
        and a signal that reaches slurmd before the step exists is dropped: so the
        SIGKILL is sent again every KILL_AGAIN s to the jobs Slurm still lists as
        pending or running, until none is. Never Slurm's plain cancel on a running job:
        its SIGTERM could reach the job first (a cancel right after the SIGKILL did, on
        a loaded machine: issue #44) and the job would not die of the signal asked
        for. A job still listed as running once Slurm's own time for a launch
        (BatchStartTimeout) is over gets Slurm's cancel, which ends it in any case."""
        deadline = time.monotonic() + self._batch_start_timeout()
        left = list(jobs)
        while True:
            for prefix, numbers in _by_cluster(left):
                self._scancel(prefix, ["--batch", "--signal=KILL"], numbers)
            time.sleep(KILL_AGAIN)
            rows = self.query([job.id for job in left])
            left = [job for job in left
                    if job.id in rows and may_still_run(rows[job.id].state)]
            if not left:
                return
            if time.monotonic() >= deadline:
                logger.warning(
                    "Slurm still lists %s as running %.0f s after a SIGKILL (their batch "
                    "step has not launched: a node slower than Slurm's BatchStartTimeout); "
                    "cancelling them the Slurm way (SIGTERM, SIGKILL after KillWait)",
                    ", ".join(job.id for job in left), self._batch_start_timeout())
                for prefix, numbers in _by_cluster(left):
                    self._scancel(prefix, [], numbers)
                return

    def _batch_start_timeout(self) -> float:
        """The cluster's BatchStartTimeout (how long Slurm gives a batch step to launch),
        read once; Slurm's default (10 s) if it cannot be read."""
        if self._launch_timeout is None:
            timeout = 10.0
            try:
                done = self.commands.run("scontrol", ["show", "config"])
                match = re.search(r"^BatchStartTimeout\s*=\s*(\d+)", done.stdout,
                                  re.MULTILINE)
                if match:
                    timeout = float(match.group(1))
            except BackendError as exc:
                logger.debug("cannot read Slurm's BatchStartTimeout: %s", exc)
            self._launch_timeout = timeout
        return self._launch_timeout

    def _scancel(self, prefix: list[str], flags: list[str], numbers: list[str]) -> None:
        # scancel ends every id it can and complains about the others (already
        # ended: "Invalid job id specified"), which is no error here
        done = self.commands.run("scancel", [*prefix, *flags, *numbers])
        if done.returncode != 0:
            logger.debug("scancel %s of %s: %s", " ".join(flags), " ".join(numbers),
                         done.stderr.strip())

    # -- Slurm's listings -------------------------------------------------------------
    @staticmethod
    def _parse_rows(text: str) -> list[QueueRow]:
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
                exitcode: int | None = exitcode_from_wait_status(int(code))
            except ValueError:
                exitcode = None
            rows.append(QueueRow(job_id, state, reason, exitcode,
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
            found = script.decode_comment(row.extra)
            if found is None or any(found.get(k) != v for k, v in labels.items()):
                continue
            status = to_status(row.state, row.exitcode, row.reason)
            if status.is_final and not (row.output and os.path.exists(row.output)):
                continue
            name = found.pop(script.NAME_LABEL, "fiber-job")
            spec = JobSpec(command=[], name=name, labels=found)
            handle = self.known_handle(row.job_id, row.output)
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
