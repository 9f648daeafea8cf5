"""The parent's own CPU per ``Process.start`` of a pool worker (issue #29).

``python -m bench.start_cost [N] [--profile] [--top K]``: starts N fiber Processes
shaped like a pool's workers (the pool worker's target and arguments, each with its
own worker id; the workers are told of no pool and exit at once) one after another in
this thread, and prints the CPU this thread spent per ``start()`` (``thread_time``:
pickling, the job's spec, the local backend's fork request and its job record; not the
hub's or the template's threads). With ``--profile``, a cProfile of those starts, the
functions of fiber's start path by own and cumulative time, in ms per start.

Local backend only (the setting ``backend`` is forced to ``local``). Runs before the
timed starts: 4 warm-up starts (the template, the hub, the first imports).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import fiber
from fiber.runtime.pool.worker import worker


def _process(i: int) -> fiber.Process:
    # a pool worker's shape (fiber.runtime.pool.placement.worker_process); the address
    # is of no pool: the worker fails to connect there and its job exits
    return fiber.Process(target=worker, name=f"PoolWorker-{i}", daemon=True,
                         args=("stream://127.0.0.1:9", 1, i, None, ()))


def run(n: int, profile: bool, top: int) -> dict[str, float]:
    """Start ``n`` processes; the CPU per start in ms (median, mean)."""
    fiber.init(backend="local")
    warm = [_process(-i) for i in range(1, 5)]
    for p in warm:
        p.start()
    procs = [_process(i) for i in range(n)]
    costs = []
    prof = cProfile.Profile(time.thread_time) if profile else None  # CPU, not waits
    for p in procs:
        t0 = time.thread_time()
        if prof is not None:
            prof.enable()
        p.start()
        if prof is not None:
            prof.disable()
        costs.append((time.thread_time() - t0) * 1000)
    for p in warm + procs:
        p.kill()
        p.join()
    if prof is not None:
        stats = pstats.Stats(prof)
        stats.sort_stats("cumulative")
        print(f"cProfile (thread CPU) of {n} starts: ms per start cumulative, own; calls per start")
        rows = []
        for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            rows.append((ct / n * 1000, tt / n * 1000, nc / n, f"{file.rsplit('/', 3)[-1]}:{line}({func})"))
        rows.sort(reverse=True)
        for ct, tt, nc, name in rows[:top]:
            print(f"{ct:8.3f} {tt:8.3f} {nc:6.1f}  {name}")
    return {"median": statistics.median(costs), "mean": statistics.fmean(costs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=64)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=45)
    args = parser.parse_args()
    cost = run(args.n, args.profile, args.top)
    print(f"parent CPU (starting thread) per Process.start, {args.n} starts: "
          f"median {cost['median']:.2f} ms, mean {cost['mean']:.2f} ms")


if __name__ == "__main__":
    main()
