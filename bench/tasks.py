"""Task functions the benchmarks send to workers.

They live in an importable module (``bench.tasks``) so that every framework can
pickle them by reference; the harness puts the repository root on ``PYTHONPATH`` so
that every kind of worker (forked, spawned, Ray, dask, Spark, ipyparallel, fiber
jobs) can import them. Keep this module free of heavy imports: cold-start numbers
include importing it in each worker.
"""

from __future__ import annotations

import os
import time


def noop(x: object = None) -> object:
    """The empty task."""
    return x


def sleep(d: float) -> float:
    """Sleep ``d`` seconds (the Fiber paper's overhead task)."""
    time.sleep(d)
    return d


def getpid(_: object = None) -> int:
    """The worker's process id."""
    return os.getpid()


def sleep_getpid(d: float) -> int:
    """Sleep ``d`` seconds and return the worker's process id."""
    time.sleep(d)
    return os.getpid()


def barrier(args: tuple[str, int, float]) -> int:
    """Check in at a file-system barrier and wait until ``n`` distinct processes have.

    ``args`` is ``(directory, n, timeout)``. A worker blocked here cannot take a
    second task, so once the barrier opens, ``n`` different workers have each run
    a task: the cold-start benchmark's definition of "the pool is up".
    Returns the process id; raises TimeoutError if the barrier never opens.
    """
    directory, n, timeout = args
    pid = os.getpid()
    open(os.path.join(directory, str(pid)), "w").close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(directory)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier: only {len(os.listdir(directory))} of {n} workers arrived")
        time.sleep(0.01)
    return pid
