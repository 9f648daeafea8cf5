"""The measurements, run inside a benchmark worker process against one session.

Each function performs one repetition and returns plain numbers (seconds, rates,
bytes) keyed by metric name; the orchestrator collects repetitions and takes medians.
"""

from __future__ import annotations

import logging
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from bench import tasks
from bench.contenders import Session

logger = logging.getLogger("fiber.bench")


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def overhead(session: Session, workers: int, durations: list[float], ideal: float,
             give_up_ratio: float, rates: dict[str, float] | None = None,
             latency_s: float | None = None) -> tuple[dict, dict]:
    """Fiber paper's overhead test: ``workers*ideal/d`` sleeps of ``d`` (ideal time ``ideal``),
    as one map (framework default chunk size and chunksize=1) and as sequential rounds of
    ``workers`` concurrent calls.

    To bound the run time of slow frameworks, a pattern is not run (it is returned in
    the second dict with the reason) when it already took more than ``give_up_ratio`` x
    ideal with longer tasks, or when the framework's measured empty-task ``rates``
    (tasks/s by chunk size label) or round-trip ``latency_s`` predict more than that."""
    out: dict[str, float] = {}
    skipped: dict[str, str] = {}
    slow: dict[str, str] = {}
    rates = rates or {}
    limit = give_up_ratio * ideal
    # untimed: every worker has the sleep task loaded (a framework's first use of a
    # function, e.g. dask shipping it, is not the overhead this test is about)
    session.round(tasks.sleep, [0.0] * workers)
    for d in sorted(durations, reverse=True):
        n = round(workers * ideal / d)
        count = round(ideal / d)
        key = f"{d * 1000:g}ms"
        runs = {
            "map_default": ((session.map, tasks.sleep, [d] * n, None),
                            n / rates["default"] if rates.get("default") else 0.0),
            "map_cs1": ((session.map, tasks.sleep, [d] * n, 1),
                        n / rates["cs1"] if rates.get("cs1") else 0.0),
            "rounds": ((_rounds, session, d, workers, count),
                       count * (d + latency_s) if latency_s else 0.0),
        }
        for pattern, ((fn, *args), predicted) in runs.items():
            if pattern in slow:
                skipped[f"{pattern}/{key}"] = slow[pattern]
                continue
            if predicted > limit:
                skipped[f"{pattern}/{key}"] = (
                    f"not run: its measured throughput/latency predict {predicted / ideal:.1f}x "
                    f"ideal (limit {give_up_ratio:g}x)")
                continue
            t, _ = _timed(fn, *args)
            out[f"{pattern}/{key}"] = t
            if t > limit:
                slow[pattern] = f"not run: already {t / ideal:.1f}x ideal with {key} tasks"
    return out, skipped


def _rounds(session: Session, d: float, workers: int, count: int) -> None:
    for _ in range(count):
        session.round(tasks.sleep, [d] * workers)


def throughput(session: Session, target_seconds: float, max_tasks: int) -> dict:
    """Empty tasks per second through ``map``, chunksize=1 and the default. The task
    count is sized from a first small probe so each measurement lasts about
    ``target_seconds``."""
    out: dict[str, float] = {}
    for label, cs in (("cs1", 1), ("default", None)):
        probe = 20
        t, _ = _timed(session.map, tasks.noop, list(range(probe)), cs)
        n = int(min(max_tasks, max(probe, probe / max(t, 1e-6) * target_seconds)))
        t, res = _timed(session.map, tasks.noop, list(range(n)), cs)
        assert list(res) == list(range(n)), "map returned wrong results"
        out[f"tasks_per_s/{label}"] = n / t
        out[f"tasks/{label}"] = n
    return out


def latency(session: Session, calls: int, max_seconds: float = 10.0) -> dict:
    """Round trip of one ``apply_async(noop).get()`` (median and 90th percentile) over
    ``calls`` calls, or fewer (at least 10) when they take more than ``max_seconds``.
    Up to 20 untimed calls first (at least 3; no more after a tenth of the time)."""
    warm_until = time.monotonic() + max_seconds / 10
    for i in range(min(20, calls)):
        if i >= 3 and time.monotonic() > warm_until:
            break
        session.call(tasks.noop, 1)
    samples: list[float] = []
    deadline = time.monotonic() + max_seconds
    for i in range(calls):
        if len(samples) >= 10 and time.monotonic() > deadline:
            break
        t, r = _timed(session.call, tasks.noop, i)
        assert r == i
        samples.append(t)
    samples.sort()
    return {"median_us": statistics.median(samples) * 1e6,
            "p90_us": samples[int(0.9 * (len(samples) - 1))] * 1e6, "calls": len(samples)}


def cold_start(start: Callable[[int], Session], n: int, timeout: float,
               hold: float = 0.2, keep: bool = False) -> dict | tuple[dict, Session]:
    """Seconds from asking for a pool of ``n`` until the last of its ``n`` workers has
    started its first task, and the seconds ``close()`` takes; with ``keep`` the pool
    is not closed but returned with the numbers (the caller closes it and may add
    ``close_seconds``).

    Rounds of ``n`` check-in tasks (chunksize=1) run until ``n`` distinct processes
    have checked in; each process stamps the wall-clock time of its first task (this
    machine's clock: the workers are local or on its containers/namespaces)."""
    rendezvous = tempfile.mkdtemp(prefix="fiber-bench-cold-")
    try:
        wall0 = time.time()
        t0 = time.perf_counter()
        session = start(n)
        rounds = 0
        ok = False
        try:
            seen: dict[tuple[str, int], float] = {}  # (host, pid) -> first task's time
            while len(seen) < n:
                if time.perf_counter() - t0 > timeout:
                    raise TimeoutError(f"only {len(seen)} of {n} workers ran a task "
                                       f"within {timeout:g} s")
                for pid, host, stamp, _ in session.map(tasks.checkin,
                                                    [(rendezvous, n, hold)] * n, 1):
                    seen.setdefault((host, pid), stamp)
                rounds += 1
            ok = True
        finally:
            t1 = time.perf_counter()
            if not (keep and ok):
                session.close()
            down = time.perf_counter() - t1
        out = {"seconds": max(seen.values()) - wall0, "rounds": rounds, "until_map_returned": t1 - t0}
        if keep:
            return out, session
        out["close_seconds"] = down
        return out
    finally:
        shutil.rmtree(rendezvous, ignore_errors=True)


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scale(start: Callable[[int], Session], n: int, long_seconds: float,
          runs: list[tuple[float, int]], start_timeout: float = 600) -> dict:
    """One fresh ``Pool(n)`` at scale.

    1. Right after asking for the pool, a map of ``n`` tasks of ``long_seconds``
       (chunksize=1): ``workers_used`` is how many distinct workers ran one (``n`` when
       workers that arrive late still get work); ``long_map_seconds`` its time.
    2. Check-in rounds (as in :func:`cold_start`) until all ``n`` workers have run a
       task: ``start_seconds`` is from asking for the pool until the last worker's first
       task (counting the long map's tasks: when it left workers without one, they
       started their first task only after it).
    3. With every worker up, for each ``(d, k)`` of ``runs``: a map of ``k*n`` sleeps of
       ``d`` (chunksize=1): ``efficiency/<d>`` (ideal ``k*d`` / actual) and
       ``cpu_ms_per_task/<d>``, the parent's CPU time (all its threads) per task.
    4. Memory: the parent's RSS, one idle worker's RSS and USS (pages only it holds).

    ``worker_cpu_ms_first_task`` (and ``_p90``): the workers' CPU time (user + system,
    ``getrusage`` in the worker) from their start to their first task, median (90th
    percentile) over the workers.

    ``hosts`` is how many distinct host names the workers reported.
    """
    import psutil

    rendezvous = tempfile.mkdtemp(prefix="fiber-bench-scale-")
    wall0 = time.time()
    t0 = time.perf_counter()
    session = start(n)
    try:
        out: dict[str, float] = {}
        first: dict[tuple[str, int], float] = {}  # (host, pid) -> its first task's time
        first_cpu: dict[tuple[str, int], float] = {}  # -> its CPU ms at that moment
        tally: list[int] = []
        if long_seconds > 0:
            t, got = _timed(session.map, tasks.sleep_checkin, [long_seconds] * n, 1)
            for pid, host, stamp, cpu in got:
                first.setdefault((host, pid), stamp)
                first_cpu.setdefault((host, pid), cpu)
            out["workers_used"] = len(first)
            out["long_map_seconds"] = t
        while len(first) < n:
            if time.perf_counter() - t0 > start_timeout:
                raise TimeoutError(f"only {len(first)} of {n} workers started "
                                   f"within {start_timeout:g} s")
            for pid, host, stamp, cpu in session.map(tasks.checkin, [(rendezvous, n, 0.2)] * n, 1):
                first.setdefault((host, pid), stamp)
                first_cpu.setdefault((host, pid), cpu)
                tally.append(pid)
        out["start_seconds"] = max(first.values()) - wall0
        out["distinct_workers"] = len(first)
        cpus = sorted(first_cpu.values())
        out["worker_cpu_ms_first_task"] = statistics.median(cpus)
        out["worker_cpu_ms_first_task_p90"] = cpus[int(0.9 * (len(cpus) - 1))]
        out["hosts"] = len({host for host, _ in first})  # where the workers ran
        for d, k in runs:
            key = f"{d * 1000:g}ms"
            count = n * k
            cpu0 = _cpu_seconds()
            t, _ = _timed(session.map, tasks.sleep, [d] * count, 1)
            cpu = _cpu_seconds() - cpu0
            out[f"efficiency/{key}"] = d * k / t
            out[f"cpu_ms_per_task/{key}"] = cpu / count * 1000
        me = psutil.Process()
        out["parent_rss_mb"] = me.memory_info().rss / 2**20
        pid = max(set(tally), key=tally.count) if tally else next(iter(first))[1]
        if psutil.pid_exists(pid):
            info = psutil.Process(pid).memory_full_info()
            out["worker_rss_mb"] = info.rss / 2**20
            out["worker_uss_mb"] = info.uss / 2**20
        return out
    finally:
        session.close()
        shutil.rmtree(rendezvous, ignore_errors=True)


def _start_join(p: Any) -> None:
    p.start()
    p.join()


def process_start(module: Any, count: int) -> dict:
    """Median seconds of ``Process(target=noop).start(); join()`` (job start latency)."""
    samples = []
    for _ in range(count):
        p = module.Process(target=tasks.noop)
        t, _ = _timed(_start_join, p)
        if p.exitcode != 0:
            raise RuntimeError(f"noop process exited with {p.exitcode}")
        samples.append(t)
    return {"median_ms": statistics.median(samples) * 1000, "min_ms": min(samples) * 1000}

