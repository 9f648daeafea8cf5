"""Profiling harness for fiber's round trip (issue #19): ``apply_async(noop, (i,)).get()``
on ``fiber.Pool(1)`` for a few seconds, reporting the wall time and the CPU time of the
parent and of the worker per round trip (from /proc), so that sampled profiles
(``py-spy record --subprocesses``) can be turned into microseconds.

    python bench/results/floor/profile_roundtrip.py SECONDS [--cprofile DIR]

With ``--cprofile DIR`` the measured loop also runs under ``cProfile`` with a per-thread
CPU clock (``time.thread_time``: what each function costs in CPU, waits excluded) in
the parent's main thread and in the worker's (started by the pool's initializer, dumped
by a last task): ``DIR/parent.prof`` and ``DIR/worker.prof``.

Not part of the suite: the note in RESULTS.md next to it says how it was used.
"""

from __future__ import annotations

import json
import os
import sys
import time

import fiber
from bench import tasks


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_worker_prof = None


def start_worker_profile() -> None:
    """Pool initializer: profile the worker's main thread (tasks and its wire reads)."""
    import cProfile

    global _worker_prof
    _worker_prof = cProfile.Profile(time.thread_time)


def toggle_worker_profile(path: str | None) -> int:
    """Start (``path`` None) or stop and dump the worker's profile."""
    if path is None:
        _worker_prof.enable()
    else:
        _worker_prof.disable()
        _worker_prof.dump_stats(path)
    return os.getpid()


def main(seconds: float, prof_dir: str | None = None) -> None:
    import cProfile

    pool = fiber.Pool(1, initializer=start_worker_profile if prof_dir else None)
    worker = pool.apply_async(tasks.getpid).get()
    for i in range(2000):  # warm
        pool.apply_async(tasks.noop, (i,)).get()
    n = 0
    prof = None
    if prof_dir:
        pool.apply_async(toggle_worker_profile, (None,)).get()
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
    p0, w0 = _cpu(os.getpid()), _cpu(worker)
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        for i in range(200):
            pool.apply_async(tasks.noop, (i,)).get()
        n += 200
    wall = time.perf_counter() - t0
    p1, w1 = _cpu(os.getpid()), _cpu(worker)
    if prof is not None:
        prof.disable()
        prof.dump_stats(os.path.join(prof_dir, "parent.prof"))
        pool.apply_async(toggle_worker_profile, (os.path.join(prof_dir, "worker.prof"),)).get()
    print(json.dumps({"calls": n, "wall_us": wall / n * 1e6,
                      "parent_cpu_us": (p1 - p0) / n * 1e6,
                      "worker_cpu_us": (w1 - w0) / n * 1e6, "worker_pid": worker}))
    pool.close()
    pool.join()


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0,
         sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--cprofile" else None)
