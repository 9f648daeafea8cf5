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

On a cluster backend (``python -m bench run --kinds adapt --backend slurm``: the run
starts and stops the backend's test engine, and the contender is ``fiber[slurm]``) the
trace is :data:`CLUSTER`'s instead of the mode's: a worker there is a job that takes
about a second to start (Slurm's test cluster), so the bursts are of longer tasks,
further apart, and a worker is given back after 2 s idle rather than 1.
"""

from __future__ import annotations

import json
import os
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
#: the trace on a cluster backend (any but local), over the mode's: 4 bursts of 40 tasks
#: of 0.25 s on 4 workers (each burst 2.5 s of work for the fixed pool), one every 30 s
CLUSTER = {"adapt_workers": 4, "adapt_bursts": 4, "adapt_tasks": 40,
           "adapt_task_seconds": 0.25, "adapt_period": 30.0, "adapt_idle_timeout": 2.0}


#: the rows measured by the engines' tests (the time from a burst's first task to the
#: first cluster worker running one, per backend): kept by hand, shown after the trace
FIRST_TASK = STORED.parent / "first-task.md"


def stored_paths() -> list[Path]:
    """The last run of this kind alone per backend: :data:`STORED` (local) and
    ``results/adapt-<backend>/latest.json`` (``--backend NAME --out
    bench/results/adapt-NAME``)."""
    return [STORED, *sorted(STORED.parent.parent.glob("adapt-*/latest.json"))]


def trace(cfg: dict, backend: str | None = None) -> dict:
    """``cfg`` with the trace of ``backend`` (default: this process's FIBER_BACKEND):
    the mode's on local, :data:`CLUSTER` on any other."""
    backend = backend or os.environ.get("FIBER_BACKEND", "local")
    return cfg if backend == "local" else {**cfg, **CLUSTER}


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

    cfg = trace(cfg)
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
    """Section 13 of RESULTS.md: this run's rows, then those of each stored run of this
    kind alone (:func:`stored_paths`) whose backend this run did not measure."""
    title = ["## 13. Adaptive pool (bursty trace)", ""]
    sources: list[tuple[dict, bool]] = []
    measured: set[str] = set()
    if data["summary"]["medians"].get("adapt"):
        sources.append((data, False))
        measured.add(data["meta"].get("fiber_backend", "local"))
    for path in stored_paths():
        stored = json.loads(path.read_text()) if path.exists() else None
        if not stored or not stored.get("summary", {}).get("medians", {}).get("adapt"):
            continue
        backend = stored["meta"].get("fiber_backend", "local")
        if backend not in measured:
            sources.append((stored, True))
            measured.add(backend)
    out = list(title)
    if not sources:
        out += ["Not measured in this run (`--kinds adapt`).", ""]
    for source, is_stored in sources:
        out += _rows(source, is_stored)
    if FIRST_TASK.exists():
        out += [*FIRST_TASK.read_text().strip().splitlines(), ""]
    return out


def _rows(data: dict, stored: bool) -> list[str]:
    """One run's rows of section 13 (its trace, its table, its targets judged)."""
    backend = data["meta"].get("fiber_backend", "local")
    cfg = trace(data["meta"]["config"], backend)
    per = data["summary"]["medians"]["adapt"]
    out = []
    if stored:
        load = data["meta"].get("machine", {}).get("loadavg")
        at = f", load {load[0]:.1f} on {data['meta']['machine'].get('nproc', '?')} cores" \
            if load else ""
        out += [f"Not measured in this run: these rows ({backend}) are from a run of this "
                f"kind alone, {data['meta']['date']}{at} (`{data['meta']['command']}`).", ""]
    out += [f"bench/adapt.py on {backend}: {cfg['adapt_bursts']} bursts of "
            f"{cfg['adapt_tasks']} tasks of "
            f"{cfg['adapt_task_seconds'] * 1000:g} ms (chunksize=1), one every "
            f"{cfg['adapt_period']:g} s, on `Pool({cfg['adapt_workers']})` as it is (fixed) "
            f"and with `adapt(minimum=0, maximum={cfg['adapt_workers']}, idle_timeout="
            f"{cfg['adapt_idle_timeout']:g})`. Worker-seconds: workers held (pending, "
            "starting, idle, busy or stopping) integrated from the pool's creation until its "
            "workers are gone; makespan: creation to the last result; burst latency: median "
            "seconds from a burst's submission to its last result. Medians of "
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
