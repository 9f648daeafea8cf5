"""The cost of a durable pool (``fiber.Pool(journal=path)``, issue #40): ``python -m
bench run --quick --kinds durable``.

* **Throughput**: ``map`` of tasks of 1 ms (``time.sleep``) on a plain pool and on a
  durable one of the same size, alternated ``durable_rounds`` times in one process; the
  ratio of their medians (the issue's bar: the durable map keeps at least 80% of the
  plain map's throughput).
* **Replay**: a program that journaled ``durable_replay_items`` results, run again:
  the time of its ``map`` answered wholly from the journal (its pool's start apart), in
  a fresh process as a re-run is (the bar: 100,000 results in under 2 s).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_REPLAY = """
import sys, time
import fiber
def ident(x):
    return x
if __name__ == "__main__":
    n = int(sys.argv[2])
    with fiber.Pool(2, journal=sys.argv[1]) as pool:
        t0 = time.perf_counter()
        values = pool.map(ident, range(n), chunksize=1000)
        seconds = time.perf_counter() - t0
        assert values == list(range(n))
        print("SECONDS", seconds, "DONE", pool.stats().done, flush=True)
"""


def nap(_: object) -> None:
    time.sleep(0.001)


def _rate(pool: object, tasks: int) -> float:
    t0 = time.perf_counter()
    pool.map(nap, range(tasks), chunksize=1)  # type: ignore[attr-defined]
    return tasks / (time.perf_counter() - t0)


def measure(cfg: dict) -> dict:
    import fiber

    workers, tasks, rounds = cfg["workers"], cfg["durable_tasks"], cfg["durable_rounds"]
    metrics: dict = {}
    with tempfile.TemporaryDirectory(prefix="fiber-bench-durable-") as where:
        plain_rates, durable_rates = [], []
        with fiber.Pool(workers) as plain, \
                fiber.Pool(workers, journal=os.path.join(where, "t.db")) as durable:
            _rate(plain, workers * 4)  # every worker up before anything is timed
            _rate(durable, workers * 4)
            for _ in range(rounds):  # alternated: both see the same machine
                plain_rates.append(_rate(plain, tasks))
                durable_rates.append(_rate(durable, tasks))
        plain_rate, durable_rate = statistics.median(plain_rates), statistics.median(durable_rates)
        metrics["tasks_per_s/plain"] = plain_rate
        metrics["tasks_per_s/durable"] = durable_rate
        metrics["durable_over_plain"] = durable_rate / plain_rate
        items = cfg["durable_replay_items"]
        script = os.path.join(where, "replay.py")
        Path(script).write_text(_REPLAY)
        journal = os.path.join(where, "r.db")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        runs = []
        for _ in range(2):  # the first run journals; the second replays
            out = subprocess.run([sys.executable, script, journal, str(items)], env=env,
                                 capture_output=True, text=True, timeout=cfg["timeout"])
            if out.returncode != 0:
                raise RuntimeError(f"replay program failed: {out.stderr[-800:]}")
            words = out.stdout.split()
            runs.append((float(words[words.index("SECONDS") + 1]),
                         int(words[words.index("DONE") + 1])))
        (first, _), (replay, ran) = runs
        if ran:
            raise RuntimeError(f"the re-run ran {ran} tasks: not answered from the journal")
        metrics["journal_seconds"] = first
        metrics["replay_seconds"] = replay
        metrics["journal_bytes"] = os.path.getsize(journal)
    return metrics


def section(data: dict) -> list[str]:
    """The durable pool's section of RESULTS.md."""
    cfg = data["meta"]["config"]
    medians = data["summary"]["medians"].get("durable", {})
    fiber = medians.get("fiber")
    if not fiber or cfg.get("durable_tasks") is None:
        return []
    ratio = fiber.get("durable_over_plain")
    replay = fiber.get("replay_seconds")
    items = cfg["durable_replay_items"]
    rows = [
        ["map of 1 ms tasks, tasks/s", f"{fiber.get('tasks_per_s/plain', 0):,.0f}",
         f"{fiber.get('tasks_per_s/durable', 0):,.0f}",
         f"{ratio:.2f}" if ratio else "-",
         "-" if ratio is None else ("met" if ratio >= 0.8 else "**not met**") + " (>= 0.80)"],
        [f"re-run answered from the journal, {items:,} results, s", "",
         f"{replay:.2f}" if replay is not None else "-", "",
         "-" if replay is None or items < 100_000 else
         ("met" if replay < 2.0 else "**not met**") + " (< 2 s at 100,000)"],
    ]
    out = ["## Durable pools (issue #40)", "",
           f"`Pool({cfg['workers']})`, {cfg['durable_tasks']:,} tasks of 1 ms per map, "
           f"chunksize=1, plain and durable pools alternated {cfg['durable_rounds']} times "
           "(medians); the replay is a fresh program mapping over what a first run "
           f"journaled (its pool's start apart). Journal of {items:,} results: "
           f"{fiber.get('journal_bytes', 0) / 1e6:.1f} MB; journaling them took "
           f"{fiber.get('journal_seconds', 0):.2f} s.", "",
           "| figure | plain | durable | durable / plain | target |", "|---|---|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]
