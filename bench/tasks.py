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


def checkin(args: tuple[str, int, float]) -> int:
    """Record this worker's first task at a file-system rendezvous, then hold a moment.

    ``args`` is ``(directory, n, hold)``. The first task a process runs creates the
    file ``<pid>`` holding the wall-clock time; then the task waits until ``n``
    processes have checked in or ``hold`` seconds have passed (holding keeps a started
    worker busy so the next tasks go to workers that have not run one yet; the bound
    keeps pools that queue several tasks per worker from deadlocking). Returns the
    process id.
    """
    directory, n, hold = args
    pid = os.getpid()
    path = os.path.join(directory, str(pid))
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(path + ".tmp", path)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        if sum(1 for name in os.listdir(directory) if not name.endswith(".tmp")) >= n:
            break
        time.sleep(0.005)
    return pid
