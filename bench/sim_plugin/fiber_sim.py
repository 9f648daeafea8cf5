"""Backend ``sim`` (bench only): a job's "process" is a simulated pool worker.

``create_job`` starts nothing: it hands the job's environment (the parent's stream
address, its control channel, the run's secret) to one of ``BENCH_SIM_PROCS``
simulator processes (``python -m bench.simulator``, started by the first call, spread
round-robin), which speaks fiber's real wire protocol to the master as a job and its
pool worker would (bench/simulator.py). Everything of the master (the Pool, its
hub, the job monitor's polls, the heartbeats) is fiber's own and untouched; only the
jobs are fake. Found through the entry point declared in ``fiber_sim-0.0.0.dist-info``
when this directory is on ``PYTHONPATH`` (nothing is installed), as the ``faulty``
test plugin.

Settings (environment of the master): ``BENCH_SIM_PROCS`` (simulator processes, 4),
``BENCH_SIM_TASK_MS`` (simulated cost of one task, 1.0), ``BENCH_SIM_CONNS`` (2: each
worker has its own connection besides its job's, as real workers; 1: its pool lines go
over its job's connection, for sizes whose 2 connections per worker exceed the
master's file descriptor limit).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fiber.backend import Backend, Job, JobSpec, JobState, JobStatus, Plugin

logger = logging.getLogger("fiber.bench")
REPO = Path(__file__).resolve().parents[2]


_RUNNING = JobStatus(JobState.RUNNING)  # (the monitor asks about every job every second)

#: the last instance made (the bench's master reads its counters)
INSTANCE: SimBackend | None = None


class _Simulator:
    """One simulator process: JSON lines to its stdin, events from its stdout."""

    def __init__(self, backend: SimBackend) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
        env.pop("FIBER_BACKEND", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.simulator"], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1)
        self._backend = backend
        self._lock = threading.Lock()
        self.stats: dict[str, Any] | None = None
        self.stats_ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True, name="fiber-sim-reader")
        self._reader.start()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps(message) + "\n")
            except (OSError, ValueError):
                logger.warning("simulator %d is gone", self.proc.pid)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for text in self.proc.stdout:
            event = json.loads(text)
            if event["op"] == "exit":
                self._backend.ended(event["id"], int(event["code"]))
            elif event["op"] == "stats":
                self.stats = event
                self.stats_ready.set()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SimBackend(Backend):
    name = "sim"
    poll_interval = 1.0  # the Backend default, as a real cluster's
    logs_lag = 0.0
    lists_others_jobs = False
    secrets_delivery = "env"  # the environment goes to our own simulator over a pipe
    max_parallel_calls = 64

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self._lock = threading.Lock()
        self._sims: list[_Simulator] = []
        self._ids = itertools.count()
        self._where: dict[str, _Simulator] = {}
        self._final: dict[str, JobStatus] = {}
        #: calls of poll() and the jobs they asked about (the monitor's polling load)
        self.polls = 0
        self.polled = 0
        global INSTANCE
        INSTANCE = self

    def _simulators(self) -> list[_Simulator]:
        with self._lock:
            if not self._sims:
                count = int(os.environ.get("BENCH_SIM_PROCS", "4"))
                self._sims = [_Simulator(self) for _ in range(count)]
            return self._sims

    def create_job(self, spec: JobSpec) -> Job:
        sims = self._simulators()
        number = next(self._ids)
        job_id = f"sim-{number}"
        sim = sims[number % len(sims)]
        self._where[job_id] = sim
        sim.send({"op": "start", "id": job_id, "env": {**spec.env, **spec.secrets}})
        return Job(id=job_id, backend=self.name, spec=spec, host="localhost",
                   pid=sim.proc.pid)

    def ended(self, job_id: str, code: int) -> None:
        self._final.setdefault(job_id, JobStatus.from_exit(code))

    def status(self, job: Job) -> JobStatus:
        return self._final.get(job.id) or _RUNNING

    def poll(self, jobs: Any) -> dict[str, JobStatus]:
        self.polls += 1
        self.polled += len(jobs)
        return {job.id: self.status(job) for job in jobs}

    def terminate(self, job: Job, force: bool = False) -> None:
        sim = self._where.get(job.id)
        if sim is not None and job.id not in self._final:
            sim.send({"op": "end", "id": job.id, "code": -9 if force else -15})

    def stats(self, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Each simulator's counters (messages sent by kind, CPU seconds)."""
        sims = self._simulators()
        for sim in sims:
            sim.stats_ready.clear()
            sim.send({"op": "stats"})
        out = []
        for sim in sims:
            if not sim.stats_ready.wait(timeout):
                raise RuntimeError(f"simulator {sim.proc.pid} did not report its counters")
            assert sim.stats is not None
            out.append(sim.stats)
        return out

    def close(self) -> None:
        with self._lock:
            sims, self._sims = self._sims, []
        for sim in sims:
            sim.close()


plugin = Plugin(package="fiber-sim", contract=1, backends={"sim": "fiber_sim:SimBackend"})
