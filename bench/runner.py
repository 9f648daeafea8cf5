"""The orchestrator: runs every benchmark for every contender, interleaved.

For each repetition, each benchmark kind runs once per contender, the contenders
rotated by one place per repetition so slow drifts of machine load hit all alike.
Each (repetition, kind, contender) runs in a fresh ``python -m bench.worker``
process with a time limit; its failure is recorded as a note, never fatal.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import baseline, machine
from bench import contenders as cmod

logger = logging.getLogger("fiber.bench")

REPO = Path(__file__).resolve().parent.parent

MODES: dict[str, dict] = {
    "smoke": {
        "reps": 1, "workers": 2, "durations": [0.01], "ideal": 0.1,
        "throughput_seconds": 0.1, "throughput_max": 2000, "latency_calls": 20, "latency_seconds": 2,
        "cold_sizes": [2], "heavy_cap": 2, "cold_timeout": 60, "cold_from_session": True,
        "scale_sizes": [4], "scale_long_seconds": 0.2, "scale_runs": [[0.05, 2]],
        "bw_sizes": [1], "bw_budget_mb": 4, "process_count": 2, "timeout": 180,
        "give_up_ratio": 3.0, "heavy_reps": 1, "scale_reps": 1, "startup_samples": 3,
        "shared_reps": 1, "shared_budget": 0.05,
        "faults_reps": 1, "faults_tasks": 400, "faults_task_seconds": 0.01,
        "faults_workers": 2, "faults_outage": 1.0,
        "floor_blocks": 1, "floor_calls": 20, "floor_rounds": 10,
        "chunks_items": 2000, "chunks_sizes": [1, 100], "chunks_reps": 1,
        "adapt_workers": 2, "adapt_bursts": 2, "adapt_tasks": 10, "adapt_task_seconds": 0.01,
        "adapt_period": 2.0, "adapt_idle_timeout": 0.3, "adapt_reps": 1,
        "sim_sizes": [50], "sim_procs": 2, "sim_task_ms": 1.0, "sim_conns": 2,
        "sim_tasks_per_worker": 20, "sim_tasks_min": 2000, "sim_idle_seconds": 1.0,
        "sim_connect_timeout": 60, "sim_reps": 1,
        "durable_tasks": 200, "durable_rounds": 1, "durable_replay_items": 2000, "durable_reps": 1,
        "dashboard_tasks": 200, "dashboard_round_seconds": 0.3, "dashboard_rounds": 1,
        "dashboard_reps": 1,
    },
    "quick": {
        "reps": 3, "workers": 5, "durations": [0.01, 0.001], "ideal": 0.5,
        "throughput_seconds": 0.5, "throughput_max": 20000, "latency_calls": 200, "latency_seconds": 3,
        "cold_sizes": [5, 50], "heavy_cap": 5, "cold_timeout": 120,
        # the cold start of 5 is measured on the pool the other benchmarks use, the one
        # of 50 in the first repetition only; bandwidth samples: 3 to 20 per size, as
        # many as fit in bw_seconds
        "cold_from_session": True, "big_cold_reps": 1,
        # one large size: a map of N tasks of 3 s on a fresh pool, then 10 x N of 100 ms
        "scale_sizes": [256], "scale_long_seconds": 3.0, "scale_runs": [[0.1, 10]],
        "scale_timeout": 600, "scale_start_timeout": 300, "spawn_scale_cap": 256,
        "bw_sizes": [1, 16, 100], "bw_budget_mb": 2000, "bw_seconds": 1.0,
        "process_count": 10, "timeout": 300,
        "give_up_ratio": 3.0, "heavy_reps": 1, "scale_reps": 1,
        # import fiber / multiprocessing: fresh interpreters per repetition (a few seconds)
        "startup_samples": 10,
        # shared state: each operation timed over shared_budget seconds in a child
        "shared_reps": 3, "shared_budget": 0.2,
        # faults (--kinds faults only): 5,000 tasks of 20 ms on 10 workers, 10 s outage
        "faults_reps": 1, "faults_tasks": 5000, "faults_task_seconds": 0.02,
        "faults_workers": 10, "faults_outage": 10.0,
        # the floor (raw Unix sockets) against fiber and mp-fork: blocks of calls/rounds
        "floor_blocks": 5, "floor_calls": 200, "floor_rounds": 100,
        # explicit chunk sizes (bench/chunks.py): 100,000 items, one repetition
        "chunks_items": 100_000, "chunks_sizes": [1, 100, 1000, 100_000], "chunks_reps": 1,
        # the bursty trace on a fixed and an adaptive pool (bench/adapt.py; --kinds adapt
        # only): 4 bursts of 100 x 20 ms on 5 workers, one every 10 s
        "adapt_workers": 5, "adapt_bursts": 4, "adapt_tasks": 100, "adapt_task_seconds": 0.02,
        "adapt_period": 10.0, "adapt_idle_timeout": 1.0, "adapt_reps": 1,
        "adapt_timeout": 900,  # the cluster trace: two runs of about 100 s, and the starts
        # the master at 1,000-10,000 simulated workers (bench/sim.py; --kinds sim only)
        "sim_sizes": [1000, 2500, 5000, 10000], "sim_procs": 4, "sim_task_ms": 1.0,
        "sim_conns": 2, "sim_tasks_per_worker": 20, "sim_tasks_min": 50_000,
        "sim_idle_seconds": 12.0, "sim_connect_timeout": 300, "sim_reps": 1,
        "sim_timeout": 3600,
        # durable pools (bench/durable.py; --kinds durable only): 2,000 tasks of 1 ms per
        # map, plain and durable alternated 5 times; a re-run of 100,000 journaled results
        "durable_tasks": 2000, "durable_rounds": 5, "durable_replay_items": 100_000,
        "durable_reps": 1,
        # the dashboard's cost (bench/dashboard_cost.py; --kinds dashboard only): maps of
        # 5,000 tiny tasks for 3 s per round, no dashboard / one idle / a page open in
        # turn, 7 rounds
        "dashboard_tasks": 5000, "dashboard_round_seconds": 3.0, "dashboard_rounds": 7,
        "dashboard_reps": 1,
    },
    "full": {
        "reps": 5, "workers": 5, "durations": [1.0, 0.1, 0.01, 0.001], "ideal": 1.0,
        "throughput_seconds": 1.0, "throughput_max": 100000, "latency_calls": 1000, "latency_seconds": 10,
        "cold_sizes": [5, 50, 256], "heavy_cap": 50, "cold_timeout": 600,
        "scale_sizes": [64, 256, 1024], "scale_long_seconds": 3.0,
        "scale_runs": [[0.1, 10], [1.0, 2]], "scale_start_timeout": 600,
        "spawn_scale_cap": 256,
        "bw_sizes": [1, 4, 16, 64, 100, 256], "bw_budget_mb": 1500, "process_count": 30,
        "timeout": 2400, "give_up_ratio": 5.0, "heavy_reps": 3, "scale_reps": 2,
        "startup_samples": 20,
        "shared_reps": 5, "shared_budget": 0.5,
        "faults_reps": 3, "faults_tasks": 5000, "faults_task_seconds": 0.02,
        "faults_workers": 10, "faults_outage": 10.0,
        "floor_blocks": 9, "floor_calls": 500, "floor_rounds": 200,
        "chunks_items": 1_000_000, "chunks_sizes": [1, 100, 1000, 100_000], "chunks_reps": 3,
        "adapt_workers": 5, "adapt_bursts": 6, "adapt_tasks": 100, "adapt_task_seconds": 0.02,
        "adapt_period": 10.0, "adapt_idle_timeout": 1.0, "adapt_reps": 3,
        "adapt_timeout": 900,
        # the master at 1,000-10,000 simulated workers (bench/sim.py; --kinds sim only)
        "sim_sizes": [1000, 2500, 5000, 10000], "sim_procs": 4, "sim_task_ms": 1.0,
        "sim_conns": 2, "sim_tasks_per_worker": 20, "sim_tasks_min": 50_000,
        "sim_idle_seconds": 12.0, "sim_connect_timeout": 300, "sim_reps": 1,
        "sim_timeout": 3600,
        "durable_tasks": 5000, "durable_rounds": 9, "durable_replay_items": 100_000,
        "durable_reps": 3,
        "dashboard_tasks": 5000, "dashboard_round_seconds": 5.0, "dashboard_rounds": 11,
        "dashboard_reps": 1,
    },
}
# Benchmark kinds and which contenders take part in each.
IPC_CONTENDERS = ["mp-fork", "mp-spawn"]  # plus fiber and the memory copy
# "startup": fiber only; its run measures `import fiber` and `import multiprocessing`
# "shared": fiber only; its run measures multiprocessing's shared objects too
# "faults": fiber only, and only when asked for (--kinds faults: it freezes engines)
# "floor": fiber (local) only; its run measures raw sockets and mp-fork too (bench/floor.py)
# "chunks": fiber, mp-fork and mp-spawn (bench/chunks.py)
# "adapt": fiber only, and only when asked for (--kinds adapt: its trace is mostly
# idle time, 40 s a repetition in --quick; on a cluster backend bench/adapt.CLUSTER's
# trace, about 200 s); bench/adapt.py
# "sim": fiber (local) only, and only when asked for (--kinds sim: minutes of a
# master carrying up to 10,000 simulated workers); bench/sim.py
# "durable": fiber (local) only, and only when asked for (--kinds durable): a durable
# pool's throughput against a plain one's, and a re-run's replay; bench/durable.py
# "dashboard": fiber (local) only, and only when asked for (--kinds dashboard): map
# throughput with no dashboard, an idle one and a page open; bench/dashboard_cost.py
KINDS = ("pool", "scale", "ipc", "startup", "shared", "faults", "floor", "chunks", "adapt",
         "sim", "durable", "dashboard")
OPT_IN = ("faults", "adapt", "sim", "durable", "dashboard")  # kinds run only when named


def _env(contender: str | None = None) -> dict[str, str]:
    """The environment of a benchmark process: the repository on ``PYTHONPATH`` (the
    harness), after a baseline contender's fiber tree (bench/baseline.py)."""
    env = dict(os.environ)
    front = baseline.pythonpath(contender) if contender and baseline.is_baseline(contender) else []
    env["PYTHONPATH"] = os.pathsep.join([*front, str(REPO),
                                         *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def _installed_backends() -> list[str]:
    try:
        from fiber.backend import registry

        return sorted(registry.backends())
    except Exception as exc:  # noqa: BLE001 - only informative
        logger.warning("cannot list fiber backends: %s", exc)
        return []


def run_worker(kind: str, contender: str, cfg: dict) -> dict:
    """Run one benchmark job in a fresh process; never raises."""
    fd, out = tempfile.mkstemp(prefix="fiber-bench-", suffix=".json")
    os.close(fd)
    spec = json.dumps({"kind": kind, "contender": contender, "config": cfg})
    limit = cfg.get(f"{kind}_timeout", cfg["timeout"])  # a kind may need longer (scale)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bench.worker", spec, out], cwd=REPO,
                            env=_env(contender), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=limit)
        result = json.loads(Path(out).read_text() or "{}")
        if not result:
            result = {"metrics": {}, "errors": {
                "worker": f"exited {proc.returncode}: {stderr.strip()[-400:]}"}}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker's own session: ours alone
        _, stderr = proc.communicate()
        result = {"metrics": {}, "errors": {"worker": f"timed out after {limit} s"},
                  "stderr_tail": stderr if len(stderr) < 12000 else stderr[:4000] + "\n[...]\n" + stderr[-8000:]}
    except json.JSONDecodeError:
        result = {"metrics": {}, "errors": {"worker": f"exited {proc.returncode} without results"}}
    finally:
        Path(out).unlink(missing_ok=True)
    result["wall_seconds"] = time.perf_counter() - t0
    return result


def plan(names: list[str] | None, kinds: list[str] | None = None
         ) -> tuple[dict[str, list[str]], dict, set[str]]:
    """The contenders of each benchmark kind (of ``kinds``, default all), a status note
    for every contender asked for, and the names of the heavy ones."""
    status: dict[str, dict] = {}
    jobs: dict[str, list[str]] = {"pool": [], "scale": [], "ipc": [], "startup": [],
                                  "shared": [], "faults": [], "floor": [], "chunks": [],
                                  "adapt": [], "sim": [], "durable": [], "dashboard": []}
    heavy = set()
    for c in cmod.by_name(names):
        why = c.missing("pool")
        old = baseline.is_baseline(c.name)  # fiber of another commit: where fiber runs
        status[c.name] = {"description": c.description, "status": "skipped" if why else "ran",
                          "note": why or ""}
        if c.heavy:
            heavy.add(c.name)
        if not why:
            jobs["pool"] += [c.name] if "pool" in c.groups else []
            jobs["scale"] += [c.name] if "scale" in c.groups else []
            jobs["chunks"] += [c.name] if c.name in ("fiber", "mp-fork", "mp-spawn") or old else []
        if (c.name.startswith("fiber") or c.name in IPC_CONTENDERS) and not c.missing("ipc"):
            jobs["ipc"].append(c.name)
            if why:
                status[c.name].update(status="partly",
                                      note=why + "; its Pipe/Queue/Process were measured")
        if c.name.startswith("fiber") and not c.missing("startup"):
            jobs["startup"].append(c.name)
            jobs["faults"].append(c.name)
            jobs["adapt"].append(c.name)  # on a cluster backend, its trace (bench/adapt.py)
            if c.name == "fiber" or old:  # the local backend: one host, as the rows mean
                jobs["shared"].append(c.name)
                jobs["floor"].append(c.name)
            if c.name == "fiber":  # not a baseline: the simulator speaks this wire protocol
                jobs["sim"].append(c.name)
                jobs["durable"].append(c.name)
                jobs["dashboard"].append(c.name)
    jobs["ipc"].append("memcpy")
    if kinds is None:  # faults, adapt, sim, durable and dashboard only when asked for
        jobs = {k: v for k, v in jobs.items() if k not in OPT_IN}
    else:
        jobs = {k: v for k, v in jobs.items() if k in kinds}
        for name, st in status.items():
            if st["status"] != "skipped" and not any(name in v for v in jobs.values()):
                st.update(status="skipped",
                          note=f"takes no part in the kinds run ({', '.join(kinds)})")
    return jobs, status, heavy


def run(mode: str, names: list[str] | None = None, out_dir: Path | None = None,
        results_md: Path | None = None, plots: bool = True, command: str = "",
        kinds: list[str] | None = None, scale_sizes: list[int] | None = None) -> dict:
    """Run the suite (the benchmark ``kinds``, default all) and write the JSON, the
    Markdown table and the plots; ``scale_sizes`` replaces the mode's pool sizes of
    the scale kind."""
    from bench import report

    cfg = dict(MODES[mode])
    if scale_sizes:
        cfg["scale_sizes"] = list(scale_sizes)
    out_dir = out_dir or REPO / "bench" / "results"
    results_md = results_md or REPO / "bench" / "RESULTS.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs, status, heavy = plan(names, kinds)
    started = datetime.datetime.now(datetime.timezone.utc)
    meta = {"mode": mode, "config": cfg, "command": command,
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": machine.describe(),
            "fiber_backend": os.environ.get("FIBER_BACKEND", "local"),
            "backends_installed": _installed_backends()}
    runs = []
    broken: set[tuple[str, str]] = set()
    for rep in range(cfg["reps"]):
        for kind, members in jobs.items():
            if not members:
                continue
            k = rep % len(members)
            for name in members[k:] + members[:k]:
                if (kind, name) in broken:
                    continue
                if kind == "pool" and rep >= cfg["heavy_reps"] and name in heavy:
                    continue
                if kind == "scale" and rep >= cfg["scale_reps"]:
                    continue
                if kind == "faults" and rep >= cfg["faults_reps"]:
                    continue
                if kind == "chunks" and rep >= cfg["chunks_reps"]:
                    continue
                if kind == "adapt" and rep >= cfg["adapt_reps"]:
                    continue
                if kind == "sim" and rep >= cfg["sim_reps"]:
                    continue
                if kind == "durable" and rep >= cfg["durable_reps"]:
                    continue
                if kind == "dashboard" and rep >= cfg["dashboard_reps"]:
                    continue
                logger.info("rep %d/%d %s %s", rep + 1, cfg["reps"], kind, name)
                res = run_worker(kind, name, dict(cfg, rep=rep))
                res.update({"kind": kind, "contender": name, "rep": rep})
                runs.append(res)
                # Keep every measurement on disk as it comes (a crash loses nothing).
                (out_dir / "latest.json").write_text(json.dumps(
                    {"meta": meta, "contenders": status, "runs": runs, "partial": True},
                    indent=1, default=str))
                errs = res.get("errors", {})
                if "worker" in errs or "start" in errs:
                    # Cannot start (or hangs): no point repeating it.
                    broken.add((kind, name))
                    first = errs.get("worker") or errs.get("start")
                    if name in status:
                        notes = [status[name]["note"]] if status[name]["note"] else []
                        status[name]["note"] = "; ".join(
                            [*notes, f"{kind} repetition {rep + 1}: {first}"])
                    logger.warning("%s %s failed: %s", kind, name, first)
    final_status(status, runs)
    meta["loadavg_end"] = list(os.getloadavg())
    meta["elapsed_seconds"] = (datetime.datetime.now(datetime.timezone.utc)
                               - started).total_seconds()
    data = {"meta": meta, "contenders": status, "runs": runs, "summary": summarize(runs)}
    (out_dir / "latest.json").write_text(json.dumps(data, indent=1, default=str))
    results_md.write_text(_plots_beside(report.markdown(data), out_dir, results_md))
    if plots:
        report.plots(data, out_dir)
    return data


def _plots_beside(md: str, out_dir: Path, results_md: Path) -> str:
    """The report links its plots as ``results/NAME.png`` (bench/RESULTS.md's view);
    point them at ``out_dir`` as seen from ``results_md``."""
    rel = Path(os.path.relpath(out_dir.resolve(), results_md.resolve().parent)).as_posix()
    return md if rel == "results" else md.replace("](results/", f"]({rel}/")


def final_status(status: dict, runs: list[dict]) -> None:
    """A contender that ran has status "failed" when none of its pool runs measured
    anything (or, in a run without the pool benchmarks, none of its runs)."""
    pools = any(r["kind"] == "pool" for r in runs)
    for name, st in status.items():
        if st["status"] == "ran" and not any(
                r["contender"] == name and (r["kind"] == "pool" or not pools)
                and r.get("metrics") for r in runs):
            st["status"] = "failed"


def rerender(json_path: Path, results_md: Path, plots: bool = True) -> dict:
    """Write RESULTS.md and the plots again from a results file (no measuring)."""
    from bench import report

    data = json.loads(json_path.read_text())
    for st in data["contenders"].values():
        if st["status"] == "failed":
            st["status"] = "ran"
    final_status(data["contenders"], data["runs"])
    data["summary"] = summarize(data["runs"])
    results_md.write_text(_plots_beside(report.markdown(data), json_path.parent, results_md))
    if plots:
        report.plots(data, json_path.parent)
    return data


def summarize(runs: list[dict]) -> dict:
    """``{bench: {contender: {metric: median over repetitions}}}`` plus the last error."""
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    errors: dict[str, dict[str, str]] = {}
    for r in runs:
        for bench, metrics in r.get("metrics", {}).items():
            slot = values.setdefault(bench, {}).setdefault(r["contender"], {})
            for m, v in metrics.items():
                slot.setdefault(m, []).append(v)
        for bench, err in r.get("errors", {}).items():
            errors.setdefault(bench, {})[r["contender"]] = err
    summary: dict = {}
    for bench, per in values.items():
        for name, metrics in per.items():
            summary.setdefault(bench, {})[name] = {
                m: statistics.median(v) for m, v in metrics.items()}
            summary[bench][name]["reps"] = max((len(v) for v in metrics.values()), default=0)
    return {"medians": summary, "errors": errors}


def command_line(argv: list[str]) -> str:
    return "python -m bench " + " ".join(shlex.quote(a) for a in argv)
