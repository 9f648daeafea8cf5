"""Jobs in bulk: seconds from ``fiber.Pool(N)`` until the cluster lists N live jobs of
the run (all submitted), and from ``pool.terminate()`` until it lists none (all gone),
on one backend's test engine (``python -m bench bulk --backend slurm``).

Each repetition runs in a fresh process (``python -m bench.bulk --child N``) that asks
the backend itself what the cluster holds: ``list_jobs`` with the run's label and one
``poll`` of what it lists, every few hundredths of a second. For reference, the same
process times ``multiprocessing.Pool(N)`` (fork) until its N processes exist and its
``terminate()``. Results: ``<out>/<backend>.json`` per backend and ``<out>/RESULTS.md``
for all of them, with the command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 600.0


def _live_count(backend: Any, labels: dict[str, str]) -> tuple[int, list[str]]:
    jobs = backend.list_jobs(labels)
    if not jobs:
        return 0, []
    statuses = backend.poll(jobs)
    live = [job.id for job in jobs if not statuses[job.id].is_final]
    return len(live), live


def child(workers: int) -> dict[str, Any]:
    """One repetition (in its own process): fiber's figures, then multiprocessing's."""
    import fiber
    from fiber.runtime import run

    backend = run.backend()
    labels = {"fiber.run": run.run_id()}
    fiber.Process  # noqa: B018 - (imports done before the clock starts)
    started = time.monotonic()
    pool = fiber.Pool(workers)
    while True:
        count, ids = _live_count(backend, labels)
        if count >= workers:
            break
        if time.monotonic() - started > TIMEOUT:
            raise SystemExit(f"only {count} of {workers} jobs submitted after {TIMEOUT} s")
        time.sleep(0.02)
    submitted = time.monotonic() - started
    arrays = len({job_id.partition("_")[0] for job_id in ids}) if "_" in ids[0] else None
    ending = time.monotonic()
    pool.terminate()
    returned = time.monotonic() - ending
    while True:
        count, _ = _live_count(backend, labels)
        if count == 0:
            break
        if time.monotonic() - ending > TIMEOUT:
            raise SystemExit(f"{count} jobs still live {TIMEOUT} s after terminate()")
        time.sleep(0.05)
    gone = time.monotonic() - ending
    pool.join()

    ctx = multiprocessing.get_context("fork")
    mp_started = time.monotonic()
    mp_pool = ctx.Pool(workers)
    mp_submitted = time.monotonic() - mp_started
    mp_ending = time.monotonic()
    mp_pool.terminate()
    mp_pool.join()
    mp_gone = time.monotonic() - mp_ending
    return {"submitted": submitted, "terminate_returned": returned, "gone": gone,
            "arrays": arrays, "mp_submitted": mp_submitted, "mp_gone": mp_gone}


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def measure(backend: str, workers: int, repeat: int, out: Path, command: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    load_start = _load()
    for index in range(repeat):
        done = subprocess.run([sys.executable, "-m", "bench.bulk", "--child", str(workers)],
                              capture_output=True, text=True, cwd=REPO,
                              timeout=3 * TIMEOUT)
        if done.returncode != 0:
            raise SystemExit(f"repetition {index + 1} failed:\n{done.stderr[-3000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{backend} repetition {index + 1}: {runs[-1]}", flush=True)
    data = {
        "backend": backend, "workers": workers, "repeat": repeat, "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(), "load_start": load_start, "load_end": _load(),
        "runs": runs,
        "median": {key: statistics.median(r[key] for r in runs)
                   for key in ("submitted", "terminate_returned", "gone", "mp_submitted",
                               "mp_gone")},
    }
    (out / f"{backend}.json").write_text(json.dumps(data, indent=2) + "\n")
    report(out)
    return data


def report(out: Path) -> None:
    """RESULTS.md of every backend measured in ``out``."""
    lines = ["# Jobs in bulk: Pool(N) to N jobs submitted, terminate() to all gone", "",
             "Written by `bench/bulk.py`. Medians of the repetitions, in seconds; "
             "*submitted*: from `fiber.Pool(N)` until the cluster lists N live jobs of "
             "the run; *terminate returned*: `pool.terminate()`'s own time; *gone*: from "
             "`terminate()` until the cluster lists none live. *arrays*: Slurm job arrays "
             "(sbatch calls) the workers came from. multiprocessing.Pool (fork) in the "
             "same process, for reference: its N processes started, and its "
             "terminate()+join(). The machine is shared: the load average (1, 5, 15 "
             "min) at the start and end of each backend's run is shown, on "
             "a machine of the given number of cores.", "",
             "| backend | N | submitted | terminate returned | gone | arrays | "
             "mp Pool(N) | mp terminate | runs | cores | load start | load end | date |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    commands = []
    for path in sorted(out.glob("*.json")):
        d = json.loads(path.read_text())
        m = d["median"]
        arrays = ",".join(str(r["arrays"]) for r in d["runs"] if r["arrays"] is not None)
        lines.append(
            f"| {d['backend']} | {d['workers']} | {m['submitted']:.2f} | "
            f"{m['terminate_returned']:.2f} | {m['gone']:.2f} | {arrays or '-'} | "
            f"{m['mp_submitted']:.2f} | {m['mp_gone']:.2f} | {d['repeat']} | {d['cpus']} | "
            f"{d['load_start']} | {d['load_end']} | {d['date']} |")
        commands.append(f"    {d['command']}")
    lines += ["", "Commands (from the repository root; the test engine is started and "
              "stopped by the command):", "", *commands, ""]
    (out / "RESULTS.md").write_text("\n".join(lines))


def main(args: argparse.Namespace, engine_of: Any, command: str) -> int:
    engine = None
    if args.backend != "local":
        engine = engine_of(args.backend)
        os.environ.update(engine.start())
    os.environ["FIBER_BACKEND"] = args.backend
    try:
        measure(args.backend, args.workers, args.repeat, args.out, command)
    finally:
        if engine is not None:
            engine.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(int(sys.argv[2]))))
    else:
        raise SystemExit("usage: python -m bench bulk --backend NAME (see bench/__main__.py)")
