"""The master at thousands of workers, by simulation (``--kinds sim``; issue #29).

One real master, a real ``fiber.Pool(N)`` in a fresh process per size, on the bench
backend ``sim`` (bench/sim_plugin): its jobs' "processes" are simulated pool workers,
many per process, in ``sim_procs`` simulator processes (bench/simulator.py) that speak
fiber's real wire protocol (handshake with the run's secret, hello, heartbeat, task
lines, partial results, give line). No job is started; the master is untouched.

Per size N: the seconds until all N workers are connected and idle; the master's RSS
growth over that (``kb_per_worker``: RSS with N workers connected minus RSS before the
pool, over N); the idle master's CPU over ``sim_idle_seconds`` (heartbeats and the job
monitor's polls: ``idle_cpu_pct``, with the heartbeats answered per second); then a map
of identity over ``range(T)`` at chunksize=1, tasks of ``sim_task_ms`` of simulated
time (no sleep, no CPU: bench/simulator.py): the sustained dispatch rate (tasks/s over
the whole map), the master's CPU per task (``resource.getrusage`` of the master
process), the simulators' CPU (to see that they were not the limit) and the results a
message carried. The map's result is checked against ``range(T)``: every task's result
arrived, once, in order. Last the pool's end (``terminate``, ``join``): its seconds
(``end_s``) and the master's CPU over them (``end_cpu_s``). Targets (issue #29): at 10,000 workers >= 20,000 tasks/s,
<= 50 KB per connected worker, per-task CPU growing < 1.5x from 1,000 to 10,000.

The master needs a file descriptor per connection: two per worker (its job's and its
own) with ``sim_conns`` 2, as real workers; a size whose 2N connections do not fit the
master's hard limit runs with one connection per worker (the worker's lines on its
job's connection), and its row says so.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PLUGIN = HERE / "sim_plugin"
STORED = HERE / "results" / "sim" / "latest.json"
TARGET_RATE = 20_000.0  # tasks/s at 10,000 workers, at least
TARGET_KB = 50.0  # KB per connected worker, at most
TARGET_CPU_GROWTH = 1.5  # per-task CPU at 10,000 over 1,000, less than
FD_MARGIN = 200  # descriptors the master needs besides its workers' connections


def _rss_kb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1024


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _delta(before: list[dict], after: list[dict], *keys: str) -> float:
    """The simulators' counters ``keys`` summed, ``after`` minus ``before``."""
    return sum(b.get(k, 0) - a.get(k, 0) for a, b in zip(before, after, strict=True)
               for k in keys)


def identity(x: Any) -> Any:
    return x


def _profile_threads() -> list[Any]:
    """Profile every thread started from now on (the hub's selector thread does the
    master's work), each with a cProfile of its own: a bench-side wrapper of
    ``threading.Thread.run``, nothing of fiber's changed."""
    import cProfile
    import threading

    profiles: list[Any] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        profiles.append(prof)
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()

    threading.Thread.run = profiled  # type: ignore[method-assign]
    return profiles


def master(n: int, tasks: int, idle_seconds: float, timeout: float,
           profile: str | None = None) -> dict[str, Any]:
    """Run in the master process (``python -m bench.sim master``): one size."""
    import fiber_sim  # the plugin module, on PYTHONPATH: the backend's counters

    import fiber

    out: dict[str, Any] = {"workers": n, "conns_per_worker": int(os.environ["BENCH_SIM_CONNS"])}
    profiles = _profile_threads() if profile else []
    rss0 = _rss_kb()
    t0 = time.perf_counter()
    pool = fiber.Pool(n)
    shown = t0
    try:
        while pool.stats().idle < n:
            if time.perf_counter() - t0 > timeout:
                # a finding, not a crash: the row says how far the master got
                s = pool.stats()
                out.update(connected=s.idle, lost=s.lost, connect_timeout_s=timeout,
                           loadavg=list(os.getloadavg()))
                if profile:
                    _write_profile(profiles, profile)
                sys.stderr.write(f"only {s.idle} of {n} simulated workers connected in "
                                 f"{timeout:g} s ({s.lost} lost)\n")
                return out
            time.sleep(1.0)  # (stats() walks every worker under the pool's lock)
            if time.perf_counter() - shown > 10:
                shown = time.perf_counter()
                s = pool.stats()
                sys.stderr.write(f"{shown - t0:.0f} s: {s.idle} of {n} connected, "
                                 f"{s.starting} starting, {s.lost} lost\n")
        out["connect_s"] = time.perf_counter() - t0
        out["connected"] = n
        out["lost"] = pool.stats().lost
        backend = fiber_sim.INSTANCE
        out["statuses_polled_start"] = backend.polled  # job statuses asked while starting
        time.sleep(1.0)  # the last hellos' replies settle
        out["rss_kb_connected"] = _rss_kb()
        out["kb_per_worker"] = (out["rss_kb_connected"] - rss0) / n
        # idle: heartbeats and polls only
        s0 = backend.stats()
        polls0, polled0 = backend.polls, backend.polled
        c0, w0 = _cpu(), time.perf_counter()
        time.sleep(idle_seconds)
        c1, w1 = _cpu(), time.perf_counter()
        s1 = backend.stats()
        idle = w1 - w0
        out["idle_cpu_pct"] = 100 * (c1 - c0) / idle
        out["heartbeats_per_s"] = _delta(s0, s1, "watch") / idle
        out["polls_per_s"] = (backend.polls - polls0) / idle
        out["statuses_polled_per_s"] = (backend.polled - polled0) / idle
        # the map
        if profile:
            import cProfile

            main = cProfile.Profile()
            profiles.append(main)
            main.enable()
        c0, w0 = _cpu(), time.perf_counter()
        got = pool.map(identity, range(tasks), chunksize=1)
        c1, w1 = _cpu(), time.perf_counter()
        if profile:
            main.disable()
            _write_profile(profiles, profile)
        s2 = backend.stats()
        if got != list(range(tasks)):
            wrong = sum(1 for i, v in enumerate(got) if v != i)
            raise RuntimeError(f"{wrong} of {tasks} results wrong or missing")
        stats = pool.stats()
        out["map_s"] = w1 - w0
        out["tasks"] = tasks
        out["tasks_per_s"] = tasks / (w1 - w0)
        out["cpu_us_per_task"] = 1e6 * (c1 - c0) / tasks
        out["master_cpu_pct_map"] = 100 * (c1 - c0) / (w1 - w0)
        out["sim_cpu_pct_map"] = 100 * _delta(s1, s2, "cpu_s") / (w1 - w0)
        sent = _delta(s1, s2, "results")
        msgs = _delta(s1, s2, "partial_msgs", "results_msgs")
        out["results_sent"] = sent
        out["results_per_msg"] = sent / msgs if msgs else None
        out["batches"] = _delta(s1, s2, "batches")
        out["recalls"] = _delta(s1, s2, "recalls")
        out["pool_done"] = stats.done
        out["recalled"] = stats.recalled  # tasks given back (recalls that moved a task)
        out["rss_kb_end"] = _rss_kb()
        out["loadavg"] = list(os.getloadavg())
    finally:
        # the end of the pool: every worker's connections drop (Hub.peer_lost per
        # connection) and its job ends; the master's seconds and CPU until join returns
        c0, w0 = _cpu(), time.perf_counter()
        pool.terminate()
        pool.join()
        out["end_s"] = time.perf_counter() - w0
        out["end_cpu_s"] = _cpu() - c0
        backend = fiber_sim.INSTANCE
        if backend is not None:
            sims = [sim.proc for sim in backend._sims]
            backend.close()  # the simulators exit once their jobs are ended
            out["simulators_left"] = sum(1 for proc in sims if proc.poll() is None)
    return out


def _write_profile(profiles: list[Any], path: str) -> None:
    import pstats

    stats = None
    for prof in profiles:
        try:
            stats = pstats.Stats(prof) if stats is None else stats.add(prof)
        except TypeError:  # a thread that never ran a profiled call
            continue
    if stats is not None:
        stats.dump_stats(path)
        with open(path + ".txt", "w") as f:
            stats.stream = f  # type: ignore[attr-defined]
            stats.sort_stats("tottime").print_stats(40)


def fits(n: int) -> bool:
    """Whether 2 connections per worker fit the master's hard descriptor limit."""
    return 2 * n + FD_MARGIN <= resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def run_size(n: int, cfg: dict, profile: str | None = None) -> dict[str, Any]:
    """One size in a fresh master process."""
    conns = cfg.get("sim_conns", 2)
    if conns == 2 and not fits(n):
        conns = 1
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN), str(REPO),
                                         *filter(None, [env.get("PYTHONPATH")])])
    env.update(FIBER_BACKEND="sim", BENCH_SIM_PROCS=str(cfg["sim_procs"]),
               BENCH_SIM_TASK_MS=str(cfg["sim_task_ms"]), BENCH_SIM_CONNS=str(conns))
    tasks = max(cfg["sim_tasks_min"], int(cfg["sim_tasks_per_worker"] * n))
    argv = [sys.executable, "-m", "bench.sim", "master", str(n), "--tasks", str(tasks),
            "--idle", str(cfg["sim_idle_seconds"]), "--timeout", str(cfg["sim_connect_timeout"])]
    if profile:
        argv += ["--profile", profile]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=cfg["sim_connect_timeout"] + 600)
    if proc.returncode != 0:
        raise RuntimeError(f"the master of {n} simulated workers failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(cfg: dict) -> dict[str, float]:
    """``<metric>/<N>`` for every size of ``sim_sizes``."""
    out: dict[str, float] = {}
    for n in cfg["sim_sizes"]:
        got = run_size(n, cfg)
        for key, value in got.items():
            if isinstance(value, (int, float)):
                out[f"{key}/{n}"] = value
        if got.get("loadavg"):
            out[f"load1/{n}"] = got["loadavg"][0]  # the machine's load as the size ended
    return out


def _fmt(v: float | None, digits: str = ".3g") -> str:
    return "-" if v is None else format(v, digits)


def judged(m: dict[str, float], sizes: list[int]) -> list[tuple[str, str, bool | None]]:
    """The three targets: (target, measured, met). A largest size whose workers did not
    all connect has missed them all; the largest size that ran its map is quoted."""
    big, small = max(sizes), min(sizes)
    ran = [n for n in sizes if f"tasks_per_s/{n}" in m]
    at = max(ran) if ran else big
    short = ""
    if at != big:
        short = (f"the master did not bring up {big:,} workers ({_fmt(m.get(f'connected/{big}'), ',.0f')} "
                 f"connected, {_fmt(m.get(f'lost/{big}'), ',.0f')} lost); at {at:,}: ")
    rate, kb = m.get(f"tasks_per_s/{at}"), m.get(f"kb_per_worker/{at}")
    c_big, c_small = m.get(f"cpu_us_per_task/{at}"), m.get(f"cpu_us_per_task/{small}")
    growth = c_big / c_small if c_big and c_small else None

    def met(ok: bool | None) -> bool | None:
        return False if short else ok

    return [
        (f">= {TARGET_RATE:,.0f} tasks/s at {big:,} workers",
         f"{short}{_fmt(rate, ',.0f')} tasks/s", met(None if rate is None else rate >= TARGET_RATE)),
        (f"<= {TARGET_KB:g} KB per connected worker at {big:,}",
         f"{short}{_fmt(kb, '.1f')} KB", met(None if kb is None else kb <= TARGET_KB)),
        (f"per-task CPU growth {small:,} -> {big:,} < {TARGET_CPU_GROWTH:g}x",
         f"{short}{_fmt(growth, '.2f')}x from {small:,}",
         met(None if growth is None else growth < TARGET_CPU_GROWTH))]


def section(data: dict) -> list[str]:
    """The section of RESULTS.md: this run's rows, else those of :data:`STORED`."""
    title = ["## 14. The master at thousands of workers (simulated workers)", ""]
    source: list[str] = []
    if not data["summary"]["medians"].get("sim"):
        stored = json.loads(STORED.read_text()) if STORED.exists() else None
        if not stored or not stored.get("summary", {}).get("medians", {}).get("sim"):
            return [*title, "Not measured in this run (`--kinds sim`).", ""]
        data = stored
        source = [f"Not measured in this run: these rows are from a run of this kind alone, "
                  f"{data['meta']['date']} (`{data['meta']['command']}`, "
                  "bench/results/sim/).", ""]
    cfg = data["meta"]["config"]
    sizes = cfg["sim_sizes"]
    out = [*title, *source,
           f"bench/sim.py: a real `fiber.Pool(N)` (one master process per size) whose "
           f"jobs are simulated workers speaking the real wire protocol, "
           f"{cfg['sim_procs']} simulator processes (bench/simulator.py); a map of identity "
           f"over range(T) at chunksize=1 (T = max({cfg['sim_tasks_min']:,}, "
           f"{cfg['sim_tasks_per_worker']:g} N)), each task {cfg['sim_task_ms']:g} ms of "
           "simulated time (no sleep). Dispatch rate: T / the map's seconds; CPU per task: "
           "the master process's getrusage over the map; KB per worker: the master's RSS "
           "growth from before the pool to all N connected, over N; idle CPU: the master "
           f"over {cfg['sim_idle_seconds']:g} s with every worker connected and no task "
           "(heartbeats, the job monitor's polls). Targets (issue #29) judged below; "
           "where the master's time goes, from its profile: bench/results/sim/ANALYSIS.md. "
           "A size whose workers did not all connect has no map: its row says how many did "
           f"in {cfg['sim_connect_timeout']:g} s and how many the master lost.", ""]
    for _name, m in sorted(data["summary"]["medians"]["sim"].items()):
        header = ["workers", "conns/worker", "connected (lost)", "connect, s", "tasks/s",
                  "master CPU us/task",
                  "master CPU % (map)", "simulators CPU % (map)", "results/message",
                  "KB/worker", "idle master CPU %", "heartbeats/s", "polls/s"]
        rows = [[f"{n:,}", _fmt(m.get(f"conns_per_worker/{n}"), "g"),
                 f"{_fmt(m.get(f'connected/{n}'), ',.0f')} ({_fmt(m.get(f'lost/{n}'), 'g')})",
                 _fmt(m.get(f"connect_s/{n}")), _fmt(m.get(f"tasks_per_s/{n}"), ",.0f"),
                 _fmt(m.get(f"cpu_us_per_task/{n}")), _fmt(m.get(f"master_cpu_pct_map/{n}")),
                 _fmt(m.get(f"sim_cpu_pct_map/{n}")), _fmt(m.get(f"results_per_msg/{n}")),
                 _fmt(m.get(f"kb_per_worker/{n}")), _fmt(m.get(f"idle_cpu_pct/{n}")),
                 _fmt(m.get(f"heartbeats_per_s/{n}")), _fmt(m.get(f"polls_per_s/{n}"))]
                for n in sizes]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out += ["", "| target | measured | met? |", "|---|---|---|"]
        out += [f"| {t} | {v} | {({True: 'met', False: '**not met**', None: '-'})[ok]} |"
                for t, v, ok in judged(m, sizes)]
    errors = data["summary"]["errors"]
    out += [f"- {n}: {e}" for n, e in errors.get("sim", {}).items()]
    out.append("")
    return out


def plot(data: dict, out_dir: Path) -> Path | None:
    """sim.png: dispatch rate, CPU per task and KB per worker against N."""
    med = data["summary"]["medians"].get("sim", {}).get("fiber")
    if not med:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = data["meta"]["config"]
    sizes = [n for n in cfg["sim_sizes"] if f"tasks_per_s/{n}" in med]
    panels = [("tasks_per_s", "tasks/s (1 ms tasks)", TARGET_RATE),
              ("cpu_us_per_task", "master CPU us per task", None),
              ("kb_per_worker", "master KB per connected worker", TARGET_KB),
              ("idle_cpu_pct", "idle master CPU % (heartbeats, polls)", None)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (key, label, target) in zip(axes, panels, strict=True):
        ax.plot(sizes, [med[f"{key}/{n}"] for n in sizes], marker="o", color="tab:red",
                label="fiber master")
        if target is not None:
            ax.axhline(target, color="black", lw=0.8, ls="--", label="target")
        ax.set_xscale("log")
        ax.set_xlabel("simulated workers N")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    short = [f"{n:,}: {med[f'connected/{n}']:,.0f} connected in {cfg['sim_connect_timeout']:g} s, "
             f"{med.get(f'lost/{n}', 0):,.0f} lost, no map"
             for n in cfg["sim_sizes"] if f"tasks_per_s/{n}" not in med and f"connected/{n}" in med]
    if short:
        fig.suptitle("; ".join(short), fontsize=9)
    fig.tight_layout()
    path = out_dir / "sim.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("master", help="(internal) one size, in this process: JSON on stdout")
    m.add_argument("workers", type=int)
    m.add_argument("--tasks", type=int, required=True)
    m.add_argument("--idle", type=float, default=5.0)
    m.add_argument("--timeout", type=float, default=300.0)
    m.add_argument("--profile", help="write the master's cProfile of the map here (+ .txt)")
    args = p.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    got = master(args.workers, args.tasks, args.idle, args.timeout, args.profile)
    sys.stdout.write(json.dumps(got) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
