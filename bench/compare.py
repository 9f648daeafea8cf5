"""The report's before/after section: fiber against ``fiber@REV`` (``--baseline REV``),
every figure both measured in the same run, as a ratio, with a verdict.

A row is ``worse`` (or ``better``) when fiber is more than :data:`MARGIN` off the
baseline's median *and* the two contenders' repetitions do not overlap (fiber's best
repetition is worse than the baseline's worst); a figure measured once per contender
can only be ``worse?`` (``better?``): repeat it to tell noise from a loss.
"""

from __future__ import annotations

from bench import baseline

MARGIN = 0.10
# Figures where more is better; the rest (seconds, microseconds, x ideal, MB, CPU) are
# better lower.
HIGHER = ("tasks_per_s/", "efficiency/", "pipe/", "queue/", "workers_used")
# Counts that describe the run rather than its speed.
SKIP = ("reps", "rounds", "calls", "hosts", "distinct_workers", "until_map_returned",
        "shm/same_host")
SKIP_PREFIX = ("tasks/",)
# Kinds whose process measures other contenders too: only fiber's figures compare.
MIXED = ("floor", "shared", "startup")


def baseline_name(data: dict) -> str | None:
    return next((n for n in data["contenders"] if baseline.is_baseline(n)), None)


def higher_is_better(metric: str) -> bool:
    return any(metric.startswith(h) or metric == h for h in HIGHER)


def _compared(bench: str, metric: str) -> bool:
    if metric in SKIP or metric.startswith(SKIP_PREFIX):
        return False
    if bench.split("/")[0] in MIXED:
        return metric.rsplit("/", 1)[-1].startswith("fiber")
    return True


def _reps(data: dict, bench: str, name: str, metric: str) -> list[float]:
    return [r["metrics"][bench][metric] for r in data["runs"]
            if r["contender"] == name and metric in r.get("metrics", {}).get(bench, {})]


def rows(data: dict, new: str = "fiber", old: str | None = None) -> list[dict]:
    """One dict per figure both ``new`` and ``old`` have: bench, metric, the medians,
    ``ratio`` (new / old), ``worse`` (> 1: new is worse, whichever way is better) and
    ``verdict``."""
    old = old or baseline_name(data)
    out: list[dict] = []
    if old is None:
        return out
    for bench, per in data["summary"]["medians"].items():
        a, b = per.get(new), per.get(old)
        if not a or not b:
            continue
        for metric, v in a.items():
            w = b.get(metric)
            if not _compared(bench, metric) or not isinstance(v, (int, float)) \
                    or not isinstance(w, (int, float)) or not v or not w:
                continue
            up = higher_is_better(metric)
            worse = w / v if up else v / w
            ra, rb = _reps(data, bench, new, metric), _reps(data, bench, old, metric)
            apart = (min(ra) > max(rb) or max(ra) < min(rb)) if ra and rb else False
            once = len(ra) < 2 or len(rb) < 2
            if worse > 1 + MARGIN and (apart or once):
                verdict = "worse?" if once else "**worse**"
            elif worse < 1 / (1 + MARGIN) and (apart or once):
                verdict = "better?" if once else "better"
            else:
                verdict = "same"
            out.append({"bench": bench, "metric": metric, "new": v, "old": w,
                        "ratio": v / w, "worse": worse, "verdict": verdict,
                        "higher_is_better": up, "reps": (len(ra), len(rb))})
    return out


def section(data: dict) -> list[str]:
    """The RESULTS.md section (ending with a blank line), none when the run had no
    baseline."""
    from bench.report import _fmt, _table

    old = baseline_name(data)
    if old is None:
        return []
    got = rows(data, "fiber", old)
    out = [f"## fiber against {old}, same run", "",
           f"`{old}` is fiber of commit {old[len(baseline.PREFIX):]} (`--baseline`, "
           "bench/baseline.py), measured in this run interleaved with the others. "
           f"Every figure both have; `fiber / {old}` is the ratio of the medians (for "
           "figures where more is better, below 1.00 is worse). Verdict: **worse** / "
           f"better when more than {MARGIN:.0%} off and no repetition of one reaches the "
           "other's range; `worse?` / `better?` when a figure was measured once "
           "(repeat it); `same` otherwise.", ""]
    if not got:
        out += [f"No figure measured for both fiber and {old} (see Contenders).", ""]
        return out
    out += _table(["benchmark", "figure", "better", "fiber", old, f"fiber / {old}",
                   "reps", "verdict"],
                  [[r["bench"], r["metric"], "higher" if r["higher_is_better"] else "lower",
                    _fmt(r["new"]), _fmt(r["old"]), f"{r['ratio']:.2f}",
                    f"{r['reps'][0]}/{r['reps'][1]}", r["verdict"]] for r in got])
    worse = [r for r in got if r["verdict"].startswith(("**worse", "worse"))]
    out += ["", f"{len(worse)} of {len(got)} figures worse beyond the margin"
            + (": " + ", ".join(f"{r['bench']} {r['metric']}" for r in worse) if worse else "")
            + ".", ""]
    return out
