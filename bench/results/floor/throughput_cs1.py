"""Throughput at chunksize=1 (issue #29's guard for the flat per-task path):
``Pool(5).map(noop, range(N), chunksize=1)`` timed 3 times in one process after a
warm-up map, printed as tasks per second (JSON).

    python bench/results/floor/throughput_cs1.py [N]

Not part of the suite: ANALYSIS.md next to it says how it was used (before and after
alternated, each from its own tree on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import sys
import time

import fiber
from bench import tasks


def main(n: int) -> None:
    with fiber.Pool(5) as pool:
        pool.map(tasks.noop, range(5000), chunksize=1)  # every worker up
        rates = []
        for _ in range(3):
            start = time.perf_counter()
            pool.map(tasks.noop, range(n), chunksize=1)
            rates.append(n / (time.perf_counter() - start))
    print(json.dumps({"tasks_per_s": [round(r) for r in rates]}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50000)
