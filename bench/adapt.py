"""A bursty trace on a fixed pool and on an adaptive one (:meth:`fiber.Pool.adapt`).

The trace: ``bursts`` bursts of ``tasks`` tasks of ``time.sleep(task_seconds)``
(chunksize=1), the k-th submitted at ``k * period`` seconds from the start (whatever the
pool's state: arrivals do not wait for the previous burst), the pool idle in between.
The same trace runs on ``Pool(workers)`` as it is, and on ``Pool(workers)`` made
adaptive with ``adapt(minimum=0, maximum=workers, idle_timeout=...)`` right away (it
starts as the fixed one does, then gives its workers back between bursts). The two
run one after the other in this process, in an order that alternates between
repetitions.

Measured: **worker-seconds held**, the integral over time of the workers the pool
holds (starting, idle, busy or stopping: a job that exists), sampled from
``Pool.stats()`` every :data:`SAMPLE` s from the pool's creation until its last worker
is gone after ``terminate()``; **makespan**, seconds from the pool's creation to the
last result of the last burst; **burst latency**, the median over bursts of the
seconds from a burst's submission to its last result (what the adaptive pool pays
for starting its workers again). Issue #28's targets: the adaptive pool holds at most
40% of the fixed pool's worker-seconds at no more than 1.2x its makespan.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

SAMPLE = 0.02  # seconds between two samples of the workers held
VARIANTS = ("fixed", "adaptive")
TARGET_WORKER_SECONDS = 0.40  # adaptive / fixed, at most
TARGET_MAKESPAN = 1.2  # adaptive / fixed, at most
#: the last run of this kind alone (``--kinds adapt --out bench/results/adapt``): the
#: section of a run that did not measure it shows that one, with its command and date
STORED = Path(__file__).resolve().parent / "results" / "adapt" / "latest.json"


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


class _Holding:
    """Samples a pool's workers held, integrated over time (a thread of the bench)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.worker_seconds = 0.0
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _held(self) -> int:
        s = self.pool.stats()
        return s.starting + s.idle + s.busy + s.stopping

    def _run(self) -> None:
        last = time.perf_counter()
        held = self._held()
        while not self._stop.is_set():
            time.sleep(SAMPLE)
            now = time.perf_counter()
            self.worker_seconds += held * (now - last)
            last = now
            held = self._held()
            self.most = max(self.most, held)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_trace(adaptive: bool, cfg: dict) -> dict[str, float]:
    """One run of the trace; metrics of :func:`measure` for one variant."""
    import fiber

    workers, bursts, tasks = cfg["adapt_workers"], cfg["adapt_bursts"], cfg["adapt_tasks"]
    seconds, period = cfg["adapt_task_seconds"], cfg["adapt_period"]
    t0 = time.perf_counter()
    pool = fiber.Pool(workers)
    holding = _Holding(pool)
    latencies = []
    try:
        if adaptive:
            pool.adapt(minimum=0, maximum=workers, idle_timeout=cfg["adapt_idle_timeout"])
        for k in range(bursts):
            delay = t0 + k * period - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.perf_counter()
            got = pool.map(nap, [seconds] * tasks, chunksize=1)
            latencies.append(time.perf_counter() - sent)
            if got != [seconds] * tasks:
                raise RuntimeError("wrong results")
        makespan = time.perf_counter() - t0
        started = pool.stats().started
    finally:
        pool.terminate()
        pool.join()
        holding.stop()
    return {"worker_seconds": holding.worker_seconds, "makespan_s": makespan,
            "burst_latency_s": statistics.median(latencies), "most_workers": holding.most,
            "workers_started": started}


def measure(cfg: dict) -> dict[str, float]:
    """``<metric>/<variant>`` for both variants of the trace (order by repetition)."""
    order = VARIANTS if cfg.get("rep", 0) % 2 == 0 else VARIANTS[::-1]
    out: dict[str, float] = {}
    for variant in order:
        for key, value in run_trace(variant == "adaptive", cfg).items():
            out[f"{key}/{variant}"] = value
    return out


def _fmt(v: float | None, digits: str = ".3g") -> str:
    return "-" if v is None else format(v, digits)


def section(data: dict) -> list[str]:
    """Section 13 of RESULTS.md: this run's rows, else those of :data:`STORED`."""
    title = ["## 13. Adaptive pool (bursty trace)", ""]
    source: list[str] = []
    if not data["summary"]["medians"].get("adapt"):
        stored = json.loads(STORED.read_text()) if STORED.exists() else None
        if not stored or not stored.get("summary", {}).get("medians", {}).get("adapt"):
            return [*title, "Not measured in this run (`--kinds adapt`).", ""]
        data = stored
        source = [f"Not measured in this run: these rows are from a run of this kind alone, "
                  f"{data['meta']['date']} (`{data['meta']['command']}`, "
                  "bench/results/adapt/).", ""]
    cfg = data["meta"]["config"]
    per = data["summary"]["medians"]["adapt"]
    out = [*title, *source,
           f"bench/adapt.py: {cfg['adapt_bursts']} bursts of {cfg['adapt_tasks']} tasks of "
           f"{cfg['adapt_task_seconds'] * 1000:g} ms (chunksize=1), one every "
           f"{cfg['adapt_period']:g} s, on `Pool({cfg['adapt_workers']})` as it is (fixed) "
           f"and with `adapt(minimum=0, maximum={cfg['adapt_workers']}, idle_timeout="
           f"{cfg['adapt_idle_timeout']:g})`. Worker-seconds: workers held (starting, idle, "
           "busy or stopping) integrated from the pool's creation until its workers are gone; "
           "makespan: creation to the last result; burst latency: median seconds from a "
           "burst's submission to its last result. Medians of "
           f"{cfg.get('adapt_reps', '?')} repetition(s). Targets (issue #28): adaptive "
           f"worker-seconds <= {TARGET_WORKER_SECONDS:.0%} of fixed, makespan <= "
           f"{TARGET_MAKESPAN:g}x fixed.", ""]
    for name, m in sorted(per.items()):
        rows = []
        for variant in VARIANTS:
            rows.append([f"{name} {variant}", _fmt(m.get(f"worker_seconds/{variant}")),
                         _fmt(m.get(f"makespan_s/{variant}")),
                         _fmt(m.get(f"burst_latency_s/{variant}")),
                         _fmt(m.get(f"most_workers/{variant}"), "g"),
                         _fmt(m.get(f"workers_started/{variant}"), "g")])
        header = ["pool", "worker-seconds", "makespan, s", "burst latency, s",
                  "most workers", "workers started"]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        ws_f, ws_a = m.get("worker_seconds/fixed"), m.get("worker_seconds/adaptive")
        mk_f, mk_a = m.get("makespan_s/fixed"), m.get("makespan_s/adaptive")
        if ws_f and ws_a is not None and mk_f and mk_a is not None:
            r_ws, r_mk = ws_a / ws_f, mk_a / mk_f
            out += ["", "| target | adaptive / fixed | met? |", "|---|---|---|",
                    f"| worker-seconds <= {TARGET_WORKER_SECONDS:.2f}x | {r_ws:.2f}x | "
                    f"{'met' if r_ws <= TARGET_WORKER_SECONDS else '**not met**'} |",
                    f"| makespan <= {TARGET_MAKESPAN:.2f}x | {r_mk:.2f}x | "
                    f"{'met' if r_mk <= TARGET_MAKESPAN else '**not met**'} |"]
    errors = data["summary"]["errors"]
    out += [f"- {n}: {e}" for n, e in errors.get("adapt", {}).items()]
    out.append("")
    return out
