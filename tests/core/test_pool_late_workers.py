"""Workers that come up late get work: a pool whose workers arrive one by one (the
``faulty`` test backend of ``tests/fault_plugin`` with ``FAULTY_START_DELAY``: the real
local backend, each job's creation held back so that the jobs arrive S seconds apart,
as a cluster grants them) runs real tasks in real worker processes.

Each task records, in files, which process ran it and when; each worker records when
it came up (its initializer). The tests assert on those records, not on the pool's own
bookkeeping: which workers ran tasks, that every task ran exactly once (a task given
back by a worker that had not started it runs elsewhere, never twice), and that no
worker that was up sat idle while a task waited unstarted in another worker's batch
(the map's tail is spread over every worker that is up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAULT_PLUGIN = Path(__file__).parent.parent / "fault_plugin"

SCRIPT = """
import json, os, sys, time
import fiber

RECORDS = sys.argv[1]
SECONDS = float(sys.argv[2])


def arrive():
    with open(os.path.join(RECORDS, f"up-{os.getpid()}"), "w") as f:
        f.write(repr(time.time()))


def work(x):
    began = time.time()
    time.sleep(SECONDS)
    with open(os.path.join(RECORDS, f"ran-{x}-{os.getpid()}"), "w") as f:
        f.write(json.dumps([began, time.time()]))
    return x * x


if __name__ == "__main__":
    workers, tasks, mode = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    with fiber.Pool(workers, initializer=arrive) as pool:
        began = time.time()
        if mode == "map":
            out = pool.map(work, range(tasks))
        elif mode == "chunksize1":
            out = pool.map(work, range(tasks), chunksize=1)
        else:
            out = sorted(pool.imap_unordered(work, range(tasks)))
        stats = pool.stats()
    print(json.dumps({"began": began, "out": out, "recalled": stats.recalled}))
"""


def run_pool(tmp_path: Path, workers: int, tasks: int, seconds: float,
             apart: float, mode: str) -> dict:
    records = tmp_path / "records"
    records.mkdir()
    path = os.pathsep.join(p for p in (str(FAULT_PLUGIN), os.environ.get("PYTHONPATH"))
                           if p)
    script = tmp_path / "late.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script), str(records), str(seconds), str(workers), str(tasks),
         mode], capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path, "FIBER_BACKEND": "faulty",
             "FAULTY_START_DELAY": str(apart)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == "", result.stderr[-3000:]  # an ordinary run warns of nothing
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["out"] == [x * x for x in range(tasks)]
    arrived = {int(p.name[3:]): float(p.read_text()) for p in records.glob("up-*")}
    runs: dict[int, list[tuple[int, float, float]]] = {}
    for p in records.glob("ran-*"):
        _, item, pid = p.name.split("-")
        began, ended = json.loads(p.read_text())
        runs.setdefault(int(item), []).append((int(pid), began, ended))
    report.update(arrived=arrived, runs=runs)
    return report


def ran_once(report: dict, tasks: int) -> dict[int, tuple[int, float, float]]:
    """Every task ran exactly once (a recall never makes a task run twice)."""
    runs = report["runs"]
    assert sorted(runs) == list(range(tasks))
    twice = {item: r for item, r in runs.items() if len(r) != 1}
    assert not twice, f"tasks run more than once: {twice}"
    return {item: r[0] for item, r in runs.items()}


def longest_idle_while_waiting(report: dict, runs: dict[int, tuple[int, float, float]]
                               ) -> tuple[float, int]:
    """The longest time a worker that was up had nothing to do while some task of the
    map had not started yet (and which worker)."""
    last_start = max(began for _, began, _ in runs.values())
    by_worker: dict[int, list[tuple[float, float]]] = {}
    for pid, began, ended in runs.values():
        by_worker.setdefault(pid, []).append((began, ended))
    worst, who = 0.0, 0
    for pid, up in report["arrived"].items():
        free = max(up, report["began"])
        for began, ended in sorted(by_worker.get(pid, [])):
            if min(began, last_start) - free > worst:
                worst, who = min(began, last_start) - free, pid
            free = ended
        if last_start - free > worst:
            worst, who = last_start - free, pid
    return worst, who


@pytest.mark.parametrize("mode", ["map", "chunksize1", "imap_unordered"])
def test_workers_arriving_one_by_one_each_run_one_of_n_long_tasks(tmp_path, mode):
    """8 workers arrive 0.25 s apart (the last about 2 s after the first); a map of 8
    tasks of 4 s runs on all 8 of them, one task each, every result once: the first
    workers up do not take the tasks of those still starting. (A task lasts longer
    than the arrivals: a queued task goes to a worker that is up at once, so a worker
    that finished its task before the last ones arrived would rightly take one.)"""
    report = run_pool(tmp_path, workers=8, tasks=8, seconds=4.0, apart=0.25,
                      mode=mode)
    runs = ran_once(report, 8)
    pids = [pid for pid, _, _ in runs.values()]
    assert len(set(pids)) == 8, f"{len(set(pids))} workers ran the 8 tasks"
    assert set(pids) <= set(report["arrived"])


@pytest.mark.parametrize("mode", ["map", "chunksize1", "imap_unordered"])
def test_no_worker_idles_while_a_task_waits_in_another_workers_batch(tmp_path, mode):
    """8 workers arrive 0.4 s apart and run 32 tasks of 1.5 s: the first workers up
    take tasks in advance, and as the queue runs dry, workers that finish, or come up,
    take back the tasks others hold but have not started. No worker sits idle for more
    than 0.5 s while a task waits (without taking back, about 1.1 s here: a worker
    finishing early waits while the last tasks sit in other workers' batches), and
    every task runs exactly once."""
    report = run_pool(tmp_path, workers=8, tasks=32, seconds=1.5, apart=0.4,
                      mode=mode)
    runs = ran_once(report, 32)
    assert len(report["arrived"]) == 8
    assert len({pid for pid, _, _ in runs.values()}) == 8
    idle, who = longest_idle_while_waiting(report, runs)
    assert idle < 0.5, (f"worker {who} idled {idle:.2f} s while a task waited; "
                        f"{report['recalled']} task(s) given back")
    assert report["recalled"] > 0
