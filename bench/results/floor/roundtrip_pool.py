"""``apply_async(noop, (i,)).get()`` in a loop on ``fiber.Pool(WORKERS)`` (environment,
default 1) after 2,000 warm-up calls: median and mean wall time per round trip, and
the CPU per round trip of the parent's main thread, of the parent process and of the
first worker's process (from /proc), in microseconds (issue #29).

    WORKERS=5 python bench/results/floor/roundtrip_pool.py [CALLS]

Not part of the suite: ANALYSIS.md next to it says how it was used.
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


def main(n: int) -> None:
    pool = fiber.Pool(int(os.environ.get("WORKERS", "1")))
    worker = pool.apply_async(tasks.getpid).get()
    for i in range(2000):
        pool.apply_async(tasks.noop, (i,)).get()
    p0, w0, t0c = _cpu(os.getpid()), _cpu(worker), time.thread_time()
    t0 = time.perf_counter()
    walls = []
    for i in range(n):
        a = time.perf_counter()
        pool.apply_async(tasks.noop, (i,)).get()
        walls.append(time.perf_counter() - a)
    wall = time.perf_counter() - t0
    t1c, p1, w1 = time.thread_time(), _cpu(os.getpid()), _cpu(worker)
    walls.sort()
    print(json.dumps({"median_us": round(walls[n // 2] * 1e6, 1), "mean_us": round(wall / n * 1e6, 1),
                      "main_cpu_us": round((t1c - t0c) / n * 1e6, 1),
                      "parent_cpu_us": round((p1 - p0) / n * 1e6, 1),
                      "worker_cpu_us": round((w1 - w0) / n * 1e6, 1)}))
    pool.close()
    pool.join()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10000)
