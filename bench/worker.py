"""One benchmark job in a fresh process: ``python -m bench.worker SPEC_JSON OUT_JSON``.

The orchestrator runs every (repetition, benchmark kind, contender) in its own
process so that contenders cannot disturb each other (leftover threads, daemons,
imported modules) and a hung contender can be killed without losing the run. The
result file holds ``{"metrics": {bench: {metric: value}}, "errors": {bench: text}}``.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import sys
import time
import traceback
from typing import Any

from bench import measure
from bench.contenders import by_name

logger = logging.getLogger("fiber.bench")


def _record(result: dict, bench: str, fn: Any) -> None:
    t0 = time.perf_counter()
    try:
        result["metrics"][bench] = fn()
    except Exception as exc:  # noqa: BLE001 - a contender's failure is a result, not a crash
        logger.warning("%s failed: %s", bench, exc)
        result["errors"][bench] = f"{type(exc).__name__}: {exc}".strip()[:500]
        result["tracebacks"][bench] = traceback.format_exc()[-4000:]
    finally:
        result["bench_seconds"][bench] = round(time.perf_counter() - t0, 2)


def _overhead(session: Any, cfg: dict, result: dict) -> dict:
    thr = result["metrics"].get("throughput", {})
    rates = {k.split("/")[1]: v for k, v in thr.items() if k.startswith("tasks_per_s/")}
    lat = result["metrics"].get("latency", {}).get("median_us")
    metrics, skipped = measure.overhead(session, cfg["workers"], cfg["durations"],
                                        cfg["ideal"], cfg["give_up_ratio"], rates,
                                        lat / 1e6 if lat else None)
    for key, why in skipped.items():
        result["errors"][f"overhead/{key}"] = why
    return metrics


def _import_framework(name: str) -> None:
    """Import a pool's machinery before anything is timed: a cold start excludes
    importing the framework. fiber's package face imports its modules on first use
    (``fiber.Pool``), and multiprocessing's context imports its pool module when a pool
    is first made; both would otherwise land inside the first timed start."""
    if name.startswith("fiber"):
        # fiber.pool itself: since #27 `fiber.Pool` is the default context's method and
        # imports no pool machinery (the pool, the wire, pynng, asyncio: about 110 ms
        # that landed in the timed cold start of 5 workers, 1.4x a baseline of 378bcfd)
        import fiber.pool  # noqa: F401
    elif name.startswith("mp-"):
        import multiprocessing.pool  # noqa: F401


def run_pool(name: str, cfg: dict, result: dict) -> None:
    contender = by_name([name])[0]
    _import_framework(name)
    workers = cfg["workers"]
    # Quick modes measure the cold start of a pool of `workers` on the pool the other
    # benchmarks then use, instead of starting a second one (Ray, ipyparallel, Spark
    # take 5-25 s to start).
    reuse = cfg.get("cold_from_session", False) and workers in cfg["cold_sizes"]
    cold = None
    t0 = time.perf_counter()
    try:
        if reuse:
            try:
                cold, session = measure.cold_start(contender.start, workers,
                                                   cfg["cold_timeout"], keep=True)
            except TimeoutError as exc:  # it started, but too slowly: a result
                result["errors"][f"cold_start/{workers}"] = f"TimeoutError: {exc}"[:500]
                session = contender.start(workers)
        else:
            session = contender.start(workers)
        session.map(measure.tasks.noop, list(range(workers * 4)), 1)
    except Exception as exc:  # noqa: BLE001
        result["errors"]["start"] = f"{type(exc).__name__}: {exc}"[:500]
        result["tracebacks"]["start"] = traceback.format_exc()[-4000:]
        return
    result["metrics"]["start"] = {"seconds": time.perf_counter() - t0}
    if name.startswith("fiber"):  # which fiber ran: this process's and a worker's
        result["fiber_file"] = {"harness": _module(name).__file__,
                                "worker": session.call(measure.tasks.fiber_file, None)}
    try:
        _record(result, "latency", lambda: measure.latency(
            session, cfg["latency_calls"], cfg["latency_seconds"]))
        _record(result, "throughput", lambda: measure.throughput(
            session, cfg["throughput_seconds"], cfg["throughput_max"]))
        _record(result, "overhead", lambda: _overhead(session, cfg, result))
    finally:
        t1 = time.perf_counter()
        session.close()
        if cold is not None:
            cold["close_seconds"] = time.perf_counter() - t1
            result["metrics"][f"cold_start/{workers}"] = cold
    for n in cfg["cold_sizes"]:
        if reuse and n == workers:
            continue
        if n > workers and cfg.get("rep", 0) >= cfg.get("big_cold_reps", cfg["reps"]):
            continue  # quick modes: the big pools in the first repetitions only
        if contender.heavy and n > cfg["heavy_cap"]:
            result["errors"][f"cold_start/{n}"] = (
                f"not run: {n} workers exceeds this mode's cap of {cfg['heavy_cap']} "
                "for runtimes with daemons")
            continue
        _record(result, f"cold_start/{n}",
                lambda n=n: measure.cold_start(contender.start, n, cfg["cold_timeout"]))


def run_scale(name: str, cfg: dict, result: dict) -> None:
    import psutil

    contender = by_name([name])[0]
    per_worker_mb = 40.0  # a guess until the first size has measured a worker's USS
    runs = [tuple(r) for r in cfg["scale_runs"]]
    for n in cfg["scale_sizes"]:
        cap = cfg.get("spawn_scale_cap")
        if name == "mp-spawn" and cap and n > cap:
            result["errors"][f"scale/{n}"] = (
                f"not run: above {cap} workers (a spawn pool starts its workers one after "
                "another, each a fresh interpreter: minutes at 1,024 on 2 cores)")
            continue
        need = n * per_worker_mb * 2**20
        avail = psutil.virtual_memory().available
        if need > 0.85 * avail:
            result["errors"][f"scale/{n}"] = (
                f"not run: {n} workers x ~{per_worker_mb:.0f} MB would use more than 85% of "
                f"the {avail / 2**30:.1f} GiB available")
            continue
        _record(result, f"scale/{n}", lambda n=n: measure.scale(
            contender.start, n, cfg["scale_long_seconds"], runs,
            cfg.get("scale_start_timeout", cfg["cold_timeout"])))
        got = result["metrics"].get(f"scale/{n}")
        if got and got.get("worker_uss_mb"):
            per_worker_mb = max(got["worker_uss_mb"], 5.0)


def _module(name: str) -> Any:
    if name.startswith("fiber"):
        import fiber

        return fiber
    import multiprocessing

    return multiprocessing.get_context("spawn" if name == "mp-spawn" else "fork")


def run_ipc(name: str, cfg: dict, result: dict) -> None:
    from bench import bandwidth

    if name == "memcpy":
        _record(result, "bandwidth", lambda: bandwidth.memcpy(
            cfg["bw_sizes"], cfg["bw_budget_mb"], cfg.get("bw_seconds")))
        return
    module = _module(name)
    if name != "mp-spawn":
        _record(result, "bandwidth", lambda: bandwidth.transfers(
            module, cfg["bw_sizes"], cfg["bw_budget_mb"], cfg.get("bw_seconds")))
    if name.startswith("fiber"):
        _record(result, "bandwidth_path", lambda: bandwidth.through_shared_memory(module))
    _record(result, "process_start", lambda: measure.process_start(module, cfg["process_count"]))


def run_startup(name: str, cfg: dict, result: dict) -> None:
    """``import fiber`` against ``import multiprocessing`` in fresh interpreters (both
    measured in this one run, interleaved)."""
    from bench import startup

    _record(result, "startup", lambda: startup.measure(cfg["startup_samples"]))


def run_shared(name: str, cfg: dict, result: dict) -> None:
    """Locks, values, arrays and events used by a child: multiprocessing, fiber on one
    host and fiber through the creator (all measured in this one run, interleaved)."""
    from bench import shared

    _record(result, "shared", lambda: shared.measure(cfg["shared_reps"],
                                                     cfg["shared_budget"]))


def run_faults(name: str, cfg: dict, result: dict) -> None:
    """A long map with workers killed, and during an outage of the cluster manager."""
    from bench import faults

    _record(result, "faults", lambda: faults.measure(
        cfg["faults_tasks"], cfg["faults_workers"], cfg["faults_task_seconds"],
        cfg["faults_outage"]))


def run_floor(name: str, cfg: dict, result: dict) -> None:
    """Raw Unix sockets (the floor), fiber and multiprocessing (fork): round trip and
    rounds, interleaved in this one run (bench/floor.py)."""
    from bench import floor

    _record(result, "floor", lambda: floor.measure(cfg["floor_blocks"], cfg["floor_calls"],
                                                   cfg["floor_rounds"]))


def run_chunks(name: str, cfg: dict, result: dict) -> None:
    """map and imap over many trivial items at explicit chunk sizes (bench/chunks.py)."""
    from bench import chunks

    _record(result, "chunks", lambda: chunks.measure(name, cfg["chunks_items"],
                                                     cfg["chunks_sizes"]))


def run_adapt(name: str, cfg: dict, result: dict) -> None:
    """A bursty trace on a fixed pool and on an adaptive one (bench/adapt.py)."""
    from bench import adapt

    _record(result, "adapt", lambda: adapt.measure(cfg))


def run_sim(name: str, cfg: dict, result: dict) -> None:
    """One real master driving thousands of simulated workers (bench/sim.py)."""
    from bench import sim

    _record(result, "sim", lambda: sim.measure(cfg))


def run_durable(name: str, cfg: dict, result: dict) -> None:
    """A durable pool's throughput against a plain one's, and a replay (bench/durable.py)."""
    from bench import durable

    _record(result, "durable", lambda: durable.measure(cfg))


def run_dashboard(name: str, cfg: dict, result: dict) -> None:
    """Map throughput with no dashboard, an idle one and a page open
    (bench/dashboard_cost.py)."""
    from bench import dashboard_cost

    _record(result, "dashboard", lambda: dashboard_cost.measure(cfg))


KINDS = {"pool": run_pool, "scale": run_scale, "ipc": run_ipc, "startup": run_startup,
         "shared": run_shared, "faults": run_faults, "floor": run_floor, "chunks": run_chunks,
         "adapt": run_adapt, "sim": run_sim, "durable": run_durable,
         "dashboard": run_dashboard}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    logging.basicConfig(level=logging.WARNING)
    # Shortly before the orchestrator's time limit, show where every thread is stuck.
    limit = spec["config"].get(f"{spec['kind']}_timeout", spec["config"]["timeout"])
    faulthandler.dump_traceback_later(max(5.0, limit - 15), exit=False)
    result: dict = {"metrics": {}, "errors": {}, "tracebacks": {}, "bench_seconds": {}}
    try:
        KINDS[spec["kind"]](spec["contender"], spec["config"], result)
    finally:
        with open(argv[1], "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
