"""Task functions the benchmarks send to workers.

They live in an importable module (``bench.tasks``) so that every framework can
pickle them by reference; the harness puts the repository root on ``PYTHONPATH`` so
that every kind of worker (forked, spawned, Ray, dask, Spark, ipyparallel, fiber
jobs) can import them. Keep this module free of heavy imports: cold-start numbers
include importing it in each worker.
"""

from __future__ import annotations

import os
import resource
import socket
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


def fiber_file(_: object = None) -> str | None:
    """Where the worker's ``fiber`` package was imported from (None: not imported):
    a baseline contender's workers must run the baseline tree's (bench/baseline.py)."""
    import sys

    module = sys.modules.get("fiber")
    return getattr(module, "__file__", None)


_first_task: float | None = None  # wall-clock time of this process's first check-in
_first_cpu: float = 0.0  # its CPU time (ms, user + system) at that moment


def _stamp_first() -> None:
    """Record this process's first task: its wall-clock time and the CPU it has spent
    so far (a forked process's count starts at the fork: for a pool worker, what it
    spent from its start to its first task, this task's unpickling included)."""
    global _first_task, _first_cpu
    if _first_task is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        _first_cpu = (r.ru_utime + r.ru_stime) * 1000
        _first_task = time.time()


def checkin(args: tuple[str, int, float]) -> tuple[int, str, float, float]:
    """Record this worker's first task, then hold a moment.

    ``args`` is ``(directory, n, hold)``. Returns ``(pid, host name, wall-clock time of
    this process's first check-in, its CPU milliseconds then)``. When ``directory`` is visible to the worker (the
    same file system), the first check-in also creates the file ``<pid>`` there, and the
    task waits until ``n`` processes have checked in or ``hold`` seconds have passed
    (holding keeps a started worker busy so the next tasks go to workers that have not
    run one yet; the bound keeps pools that queue several tasks per worker from
    deadlocking); elsewhere (a container without the directory) it holds ``hold``
    seconds.
    """
    directory, n, hold = args
    pid = os.getpid()
    _stamp_first()
    shared = os.path.isdir(directory)
    if shared:
        path = os.path.join(directory, str(pid))
        if not os.path.exists(path):
            with open(path + ".tmp", "w") as f:
                f.write(repr(_first_task))
            os.replace(path + ".tmp", path)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        if shared and sum(1 for name in os.listdir(directory)
                          if not name.endswith(".tmp")) >= n:
            break
        time.sleep(0.005)
    return pid, socket.gethostname(), _first_task or 0.0, _first_cpu


def sleep_checkin(d: float) -> tuple[int, str, float, float]:
    """Sleep ``d`` seconds; return ``(pid, host name, wall-clock time of this process's
    first task, its CPU milliseconds then)`` (the first task being this one or an
    earlier :func:`checkin`)."""
    _stamp_first()
    time.sleep(d)
    return os.getpid(), socket.gethostname(), _first_task or 0.0, _first_cpu
