"""Rounds of 5 x 1 ms on ``fiber.Pool(5)`` (issue #29's rounds target, the floor kind's
pattern): ``apply_async(sleep, (0.001,))`` five times, then the five ``get()``, repeated;
the median and p90 round in milliseconds over ROUNDS rounds after 50 warm-up rounds,
the parent's CPU per round (microseconds, from /proc), and (where the pool has them)
the share of results that took the reply path on the caller's thread and the
handlers queued for the ``fiber-pool-lines`` helper, printed as JSON.

    python bench/results/floor/rounds_pool.py [ROUNDS]

Not part of the suite: ANALYSIS.md next to it says how it was used (before and after
alternated, each from its own tree first on ``PYTHONPATH``).
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
    with fiber.Pool(5) as pool:
        for _ in range(50):
            for h in [pool.apply_async(tasks.sleep, (0.001,)) for _ in range(5)]:
                h.get()
        c0 = _cpu(os.getpid())
        rounds = []
        for _ in range(n):
            t0 = time.perf_counter()
            for h in [pool.apply_async(tasks.sleep, (0.001,)) for _ in range(5)]:
                h.get()
            rounds.append(time.perf_counter() - t0)
        c1 = _cpu(os.getpid())
        channel = pool._worker_set._hub.channel(pool._cid)
        direct = getattr(channel, "direct_results", None)
        queued = channel._handoff.queued
    rounds.sort()
    print(json.dumps({"median_ms": round(rounds[n // 2] * 1e3, 3),
                      "p90_ms": round(rounds[int(0.9 * (n - 1))] * 1e3, 3),
                      "parent_cpu_us_per_round": round((c1 - c0) / n * 1e6),
                      "direct_share": None if direct is None else round(direct / (5 * (n + 50)), 3),
                      "queued_for_helper": queued}))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 500)
