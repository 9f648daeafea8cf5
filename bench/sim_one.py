"""One size of the simulated-workers benchmark (:mod:`bench.sim`) with small settings,
its main figures as JSON on stdout: ``python -m bench.sim_one 1000`` (issue #29: used
for the end of a pool and the job monitor's polling, bench/results/sim/ANALYSIS.md)."""

from __future__ import annotations

import json
import sys

from bench import sim

CFG = {"sim_procs": 2, "sim_task_ms": 1.0, "sim_conns": 2, "sim_tasks_per_worker": 5,
       "sim_tasks_min": 5000, "sim_idle_seconds": 4.0, "sim_connect_timeout": 240}
KEEP = ["workers", "connect_s", "lost", "statuses_polled_start", "idle_cpu_pct",
        "polls_per_s", "statuses_polled_per_s", "tasks_per_s", "cpu_us_per_task", "end_s",
        "end_cpu_s", "simulators_left", "loadavg"]


def main(argv: list[str]) -> int:
    got = sim.run_size(int(argv[0]), CFG)
    sys.stdout.write(json.dumps({k: got.get(k) for k in KEEP}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
