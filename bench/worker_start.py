"""A worker's CPU from its start to its first task, and its page faults then (issue #29).

``python -m bench.worker_start [N] [--rounds R]``: a fresh ``fiber.Pool(N)`` and a
``multiprocessing`` fork pool of N, alternated R times (interleaved: a drift of the
machine's load hits both alike). Each worker records, at its first task, its CPU time
(user + system, ``getrusage`` in the worker: a forked process's count starts at its
fork) and its minor page faults; a map of tasks that hold a worker for a moment runs
until every worker has run one. Prints the median and 90th percentile of each pool.

Minor faults are the load-independent part: a forked worker writing to a page it
shares with its parent (the template, for fiber) copies it, a few microseconds each
on a virtual machine. The suite's scale kind reports the same CPU figure
(``worker_cpu_ms_first_task``); this is the quick look, with the faults.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import time

_first: tuple[float, int] | None = None  # (CPU ms, minor faults) at the first task


def first_task(hold: float) -> tuple[int, float, int]:
    """Record this worker's first task; hold it ``hold`` seconds (so that the next
    tasks go to workers that have not run one); return ``(pid, CPU ms, faults)``."""
    global _first
    if _first is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        _first = ((r.ru_utime + r.ru_stime) * 1000, r.ru_minflt)
    time.sleep(hold)
    return os.getpid(), _first[0], _first[1]


def measure(pool_factory, n: int, hold: float = 0.3, timeout: float = 300) -> dict:
    """Start a pool of ``n`` and map until every worker has run a task."""
    seen: dict[int, tuple[float, int]] = {}
    t0 = time.monotonic()
    with pool_factory(n) as pool:
        while len(seen) < n:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"only {len(seen)} of {n} workers ran a task")
            for pid, cpu, faults in pool.map(first_task, [hold] * n, 1):
                seen.setdefault(pid, (cpu, faults))
    cpus = sorted(c for c, _ in seen.values())
    faults = sorted(f for _, f in seen.values())
    p90 = int(0.9 * (n - 1))
    return {"cpu_ms": statistics.median(cpus), "cpu_ms_p90": cpus[p90],
            "faults": statistics.median(faults), "faults_p90": faults[p90]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_start", description=__doc__)
    parser.add_argument("n", type=int, nargs="?", default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import fiber

    fork = multiprocessing.get_context("fork")
    pools = {"fiber": fiber.Pool, "mp-fork": fork.Pool}
    print(f"load average {os.getloadavg()[0]:.1f}; {args.n} workers")
    for _ in range(args.rounds):
        for name, factory in pools.items():
            m = measure(factory, args.n)
            print(f"{name:8} CPU to first task {m['cpu_ms']:.2f} ms (p90 {m['cpu_ms_p90']:.2f}), "
                  f"minor faults {m['faults']:.0f} (p90 {m['faults_p90']:.0f})")


if __name__ == "__main__":
    main()
