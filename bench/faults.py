"""Faults: the time a long map loses to killed workers and to an outage of the cluster
manager (issue #17), on the backend the run measures (``--backend``).

Three maps of the same tasks (``faults_tasks`` tasks of ``faults_task_seconds``,
chunksize=1) on a fresh ``fiber.Pool(faults_workers)`` each, its workers up before the
clock starts:

* ``clean``: no fault;
* ``kills``: 20% of the workers (at least one) are SIGKILLed, one every 0.5 s from 0.5 s
  into the map, each a random busy one;
* ``outage``: the cluster manager is taken away for ``faults_outage`` seconds from
  0.2 s into the map, and the same kills happen during it, so their replacements wait
  for the manager. The outage is the fault tests' own: on ``local`` the backend's
  template process (its fork server, which starts every job) is frozen with SIGSTOP;
  on an engine, ``freeze()`` / ``thaw()`` of ``tests/engines/<backend>.py`` (SIGSTOP of
  slurmctld, dockerd or kube-apiserver; an SSH host's link cut).

Kills and outage are driven by ``tests/fault_map.py`` (the fault tests' machinery).
Every map's result is checked (each result once, right and in order); a wrong one is
an error, not a time. Reported: the three times, and the time lost to the kills
(``kills - clean``) and to the kills during the outage (``outage - clean``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import tasks

REPO = Path(__file__).resolve().parent.parent
KILL_FRACTION = 0.2


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (a dataclass looks its module up)
    spec.loader.exec_module(module)
    return module


def nap(seconds: float, i: int) -> int:
    """The task: sleep ``seconds``, return ``i``."""
    time.sleep(seconds)
    return i


def _templates() -> list[int]:
    """This process's local-backend template processes."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_bytes().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"fiber.backend.local.forkserver" in cmd:
            found.append(int(entry))
    return found


class _TemplatePause:
    """The local backend's outage: its template processes frozen."""

    def __init__(self) -> None:
        self.frozen: list[int] = []

    def freeze(self) -> None:
        self.frozen = _templates()
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _outage(backend: str) -> Any:
    """An object with ``freeze()`` and ``thaw()`` for the backend's cluster manager."""
    if backend == "local":
        return _TemplatePause()
    path = REPO / "tests" / "engines" / f"{backend}.py"
    engine = _load(f"fiber_bench_faults_engine_{backend}", path)
    if not hasattr(engine, "freeze"):
        raise RuntimeError(f"{path} has no freeze()/thaw() for an outage")
    return engine


def _one_map(fault_map: ModuleType, backend: str, workers: int, n: int, seconds: float,
             kills: int, outage: Any | None, outage_seconds: float) -> float:
    import fiber
    from fiber.runtime.run import run_id

    with fiber.Pool(workers) as pool:
        pool.map(tasks.noop, range(4 * workers), chunksize=1)  # the workers are up
        victims = None
        if backend == "docker":  # pids of containers: find the host's
            def victims(killed: list[int]) -> list[int]:
                return [p for p in fault_map.job_processes(run_id()) if p not in killed]
        result, faults = fault_map.map_under_faults(
            pool, functools.partial(nap, seconds), n, victims=victims, kills=kills,
            every=0.5, seed=41,
            freeze=outage.freeze if outage is not None else None,
            thaw=outage.thaw if outage is not None else None,
            outage_after=0.2, outage_seconds=outage_seconds)
    if result != list(range(n)):
        raise RuntimeError("a map under faults returned wrong results")
    if len(faults.kills) < kills:
        raise RuntimeError(f"the map ended after {len(faults.kills)} of {kills} kills: "
                           "make it longer (faults_tasks)")
    if outage is not None and not faults.killed_in_outage:
        raise RuntimeError("no worker was killed during the outage")
    return faults.seconds


def measure(n: int, workers: int, seconds: float, outage_seconds: float) -> dict[str, float]:
    """The three maps (see the module docstring); seconds."""
    backend = os.environ.get("FIBER_BACKEND", "local")
    fault_map = _load("fiber_bench_fault_map", REPO / "tests" / "fault_map.py")
    kills = max(1, round(KILL_FRACTION * workers))
    run = functools.partial(_one_map, fault_map, backend, workers, n, seconds)
    clean = run(0, None, 0.0)
    killed = run(kills, None, 0.0)
    outage = run(kills, _outage(backend), outage_seconds)
    return {"clean_s": clean, "kills_s": killed, "outage_s": outage,
            "lost_to_kills_s": killed - clean, "lost_to_outage_s": outage - clean,
            "kills": float(kills), "workers": float(workers), "tasks": float(n),
            "task_s": seconds, "outage_length_s": outage_seconds,
            "ideal_s": n * seconds / workers}


def markdown(data: dict) -> list[str]:
    """RESULTS.md's section of this benchmark."""
    per = data["summary"]["medians"].get("faults", {})
    out = ["## 10. Faults", "",
           "The time a map loses to faults (bench/faults.py): the same map of short "
           "sleeping tasks (chunksize=1) with no fault, with 20% of the pool's workers "
           "SIGKILLed, and with those kills during an outage of the cluster manager (on "
           "`local` the backend's template process frozen, on an engine the fault tests' "
           "freeze of its manager). Every result is checked; seconds, medians of "
           f"{data['meta']['config'].get('faults_reps', '?')} repetition(s) (the ideal is "
           "tasks x duration / workers; lost: the median of the repetitions' differences to "
           "the map with no fault).", ""]
    if not per:
        out.append("Not measured in this run (`--kinds faults`).")
        return out
    rows = []
    for name, m in per.items():
        rows.append([
            name if "[" in name else f"{name} ({data['meta'].get('fiber_backend', 'local')})",
            f"{int(m['tasks'])} x {m['task_s'] * 1000:g} ms on {int(m['workers'])}",
            f"{m['ideal_s']:.1f}", f"{m['clean_s']:.1f}",
            f"{m['kills_s']:.1f} ({m['lost_to_kills_s']:+.1f})",
            f"{m['outage_s']:.1f} ({m['lost_to_outage_s']:+.1f})",
            f"{int(m['kills'])} kills, {m['outage_length_s']:g} s outage"])
    out += ["| contender | map | ideal | no fault | 20% killed (lost) "
            "| killed in an outage (lost) | faults |",
            "|---|---|---|---|---|---|---|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    errors = data["summary"].get("errors", {}).get("faults", {})
    out += [f"\n{name}: {text}" for name, text in errors.items()]
    return out

