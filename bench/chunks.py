"""Explicit chunk sizes: ``Pool.map`` and ``Pool.imap`` over many trivial items.

Each contender (``fiber``, ``mp-fork``, ``mp-spawn``) runs in its own fresh process,
interleaved with the others by the orchestrator: a pool of one worker per CPU, then,
for every chunk size of the mode, ``pool.map(identity, range(n), chunksize)`` and
``list(pool.imap(identity, range(n), chunksize))``, each timed once and checked (every
result in order). ``--full`` runs 1,000,000 items at chunk sizes 1, 100, 1,000 and
100,000 (issue #15); ``--quick`` runs 100,000 items in one repetition, to stay within
its budget. The report gives seconds and the ratio of fiber's time to each
multiprocessing context's (below 1.00: fiber is faster).
"""

from __future__ import annotations

import os
import time
from typing import Any

from bench import baseline

CONTENDERS = ("fiber", "mp-fork", "mp-spawn")
METHODS = ("map", "imap")


def identity(x: Any) -> Any:
    return x


def _pool(name: str, workers: int) -> Any:
    if name.startswith("fiber"):
        import fiber

        return fiber.Pool(workers)
    import multiprocessing

    return multiprocessing.get_context("spawn" if name == "mp-spawn" else "fork").Pool(workers)


def workers() -> int:
    return os.cpu_count() or 1


def measure(name: str, items: int, chunksizes: list[int]) -> dict[str, float]:
    """``s/<method>/cs=<chunksize>``: seconds of each call, on one pool."""
    expected = list(range(items))
    out: dict[str, float] = {}
    pool = _pool(name, workers())
    try:
        pool.map(identity, range(workers() * 4), 1)  # every worker up
        for cs in chunksizes:
            for method in METHODS:
                t0 = time.perf_counter()
                if method == "map":
                    got = pool.map(identity, range(items), cs)
                else:
                    got = list(pool.imap(identity, range(items), cs))
                out[f"s/{method}/cs={cs}"] = time.perf_counter() - t0
                if got != expected:
                    raise RuntimeError(f"{name} {method} chunksize={cs}: wrong results")
                del got
    finally:
        pool.terminate()
        pool.join()
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def section(data: dict) -> list[str]:
    """Section 12 of RESULTS.md."""
    cfg = data["meta"]["config"]
    medians = data["summary"]["medians"].get("chunks", {})
    if not medians or cfg.get("chunks_items") is None:
        return []  # a run without this kind (or from before it existed)
    items = cfg.get("chunks_items")
    reps = cfg.get("chunks_reps", cfg.get("reps"))
    out = ["## 12. Explicit chunk sizes", "",
           f"`Pool.map(identity, range({items:,}), chunksize)` and "
           f"`list(Pool.imap(identity, range({items:,}), chunksize))` on a pool of one "
           f"worker per CPU ({data['meta']['machine'].get('nproc', '?')}), each contender "
           "in a fresh process; seconds, medians of "
           f"{reps} repetition(s). Ratios are fiber's time over multiprocessing's (below "
           "1.00: fiber is faster); the bar (issue #15) is fiber at multiprocessing's "
           "speed or better, i.e. a ratio <= 1.00 to `mp-fork`."
           + (" Quick mode: 100,000 items, one repetition (the issue's size, 1,000,000, "
              "is `--full`)." if data["meta"]["mode"] == "quick" else ""), ""]
    fiber = next((n for n in medians  # fiber; a baseline (fiber@REV): bench/compare.py
                  if n.startswith("fiber") and not baseline.is_baseline(n)), None)
    if fiber is None:
        out.append("Not measured in this run.")
    else:
        rows = []
        for cs in cfg.get("chunks_sizes", []):
            for method in METHODS:
                key = f"s/{method}/cs={cs}"
                fb = medians.get(fiber, {}).get(key)
                fork = medians.get("mp-fork", {}).get(key)
                spawn = medians.get("mp-spawn", {}).get(key)
                r_fork = fb / fork if fb and fork else None
                r_spawn = fb / spawn if fb and spawn else None
                rows.append([method, f"{cs:,}", _fmt(fb), _fmt(fork), _fmt(spawn),
                             _fmt(r_fork), _fmt(r_spawn),
                             "-" if r_fork is None else
                             ("met" if r_fork <= 1.0 else "**not met**")])
        header = ["call", "chunksize", f"{fiber}, s", "mp-fork, s", "mp-spawn, s",
                  "fiber / mp-fork", "fiber / mp-spawn", "<= 1.00x mp-fork?"]
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
    errors = data["summary"]["errors"]
    for key in sorted(errors):
        if key == "chunks":
            out += [f"- {n}: {e}" for n, e in errors[key].items()]
    return out
