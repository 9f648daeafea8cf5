"""Command line: ``python -m bench run --quick|--full [--contenders a,b] [--backend NAME]``;
``python -m bench es [--backend NAME] [--workers 1,2,5]`` (the ES demo's plot, bench/es.py);
``python -m bench bulk --backend NAME [--workers 256]`` (jobs in bulk, bench/bulk.py)."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from bench import baseline, bulk, es, runner

logger = logging.getLogger("fiber.bench")


def _engine(name: str):
    path = runner.REPO / "tests" / "engines" / f"{name}.py"
    if not path.exists():
        raise SystemExit(f"no test engine for backend {name!r}: {path} does not exist "
                         "(start the engine yourself and set FIBER_BACKEND instead)")
    spec = importlib.util.spec_from_file_location(f"fiber_bench_engine_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the benchmarks and write results")
    mode = r.add_mutually_exclusive_group(required=True)
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="small sizes, 3 repetitions (under 5 minutes)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="every size, 5 repetitions (tens of minutes)")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="minimal sizes, 1 repetition: checks the machinery (for tests)")
    r.add_argument("--contenders", help="comma-separated names (default: all installed)")
    r.add_argument("--kinds", help="comma-separated benchmark kinds to run (default all but faults and adapt: "
                   + ",".join(runner.KINDS) + ")")
    r.add_argument("--scale-sizes", help="comma-separated pool sizes for the scale kind "
                   "(default: the mode's, e.g. 256 in --quick, 64,256,1024 in --full)")
    r.add_argument("--backend", help="measure fiber on this backend: starts and stops its "
                   "test engine via tests/engines/NAME.py (compared with mp-fork)")
    r.add_argument("--out", type=Path, help="directory for latest.json and the plots "
                   "(default bench/results)")
    r.add_argument("--results-md", type=Path, help="Markdown file (default bench/RESULTS.md)")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    r.add_argument("--baseline", metavar="REV", help="add the contender fiber@REV: fiber "
                   "of commit REV (a detached worktree in $BENCH_BASELINE_CACHE, "
                   "default /var/cache/fiber/bench-baseline), local backend only; the "
                   "report compares fiber with it row by row (bench/baseline.py)")
    e = sub.add_parser("es", help="the ES demo's plot (examples/es.py --plot): es.png, es.json")
    e.add_argument("--workers", default="1,2,5", help="worker counts, comma-separated")
    e.add_argument("--backend", help="run on this backend's test engine (tests/engines/NAME.py)")
    e.add_argument("--out", type=Path, default=runner.REPO / "bench" / "results",
                   help="directory for es.png and es.json (default bench/results)")
    e.add_argument("--iterations", type=int, default=40)
    e.add_argument("--population", type=int, default=48)
    e.add_argument("--max-steps", type=int, default=500)
    e.add_argument("--threshold", type=float, default=300.0,
                   help="mean reward whose time to reach the plot shows")
    b = sub.add_parser("bulk", help="Pool(N) to N jobs submitted, terminate() to all "
                       "gone, on a backend's test engine (bench/bulk.py)")
    b.add_argument("--backend", required=True)
    b.add_argument("--workers", type=int, default=256)
    b.add_argument("--repeat", type=int, default=3)
    b.add_argument("--out", type=Path, default=runner.REPO / "bench" / "results" / "bulk")
    g = sub.add_parser("report", help="rewrite RESULTS.md and the plots from a results file")
    g.add_argument("--json", type=Path, default=runner.REPO / "bench" / "results" / "latest.json")
    g.add_argument("--results-md", type=Path, default=runner.REPO / "bench" / "RESULTS.md")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.command == "es":
        return _es(args)
    if args.command == "bulk":
        return bulk.main(args, _engine, runner.command_line(argv))
    if args.command == "report":
        if not args.json.exists():
            raise SystemExit(f"error: {args.json} does not exist (run `python -m bench run` first)")
        runner.rerender(args.json, args.results_md)
        return 0
    names = args.contenders.split(",") if args.contenders else None
    if names is not None:
        try:
            runner.cmod.by_name(names)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from None
    kinds = args.kinds.split(",") if args.kinds else None
    if kinds is not None and set(kinds) - set(runner.KINDS):
        raise SystemExit(f"error: unknown kind(s) {', '.join(sorted(set(kinds) - set(runner.KINDS)))}"
                         f"; choose from {', '.join(runner.KINDS)}")
    scale_sizes = None
    if args.scale_sizes:
        try:
            scale_sizes = [int(n) for n in args.scale_sizes.split(",")]
        except ValueError:
            raise SystemExit(f"error: --scale-sizes takes whole numbers: {args.scale_sizes!r}"
                             ) from None
    if args.baseline:
        names = _with_baseline(args, names)
    engine = None
    if args.backend and args.backend != "local":
        engine = _engine(args.backend)
        settings = engine.start()
        os.environ.update(settings)
        os.environ["FIBER_BACKEND"] = args.backend
        names = names or ["fiber", "mp-fork"]
    try:
        data = runner.run(args.mode, names=names, out_dir=args.out, results_md=args.results_md,
                          plots=not args.no_plots, command=runner.command_line(argv),
                          kinds=kinds, scale_sizes=scale_sizes)
    finally:
        if engine is not None:
            engine.stop()
    failed = [n for n, s in data["contenders"].items() if s["status"] == "failed"]
    logger.info("done in %.0f s; failed: %s", data["meta"]["elapsed_seconds"],
                ", ".join(failed) or "none")
    return 0


def _with_baseline(args: argparse.Namespace, names: list[str] | None) -> list[str]:
    """The contenders with ``fiber@REV`` second (after fiber); makes its tree."""
    if (args.backend or os.environ.get("FIBER_BACKEND") or "local") != "local":
        raise SystemExit("error: --baseline runs on the local backend only (a cluster "
                         "backend's jobs get fiber from their image or host)")
    try:
        name = baseline.prepare(args.baseline)
    except (ValueError, RuntimeError) as exc:
        raise SystemExit(f"error: {exc}") from None
    names = [n for n in names or [c.name for c in runner.cmod.all_contenders()] if n != name]
    at = names.index("fiber") + 1 if "fiber" in names else 0
    return [*names[:at], name, *names[at:]]


def _es(args: argparse.Namespace) -> int:
    engine = None
    if args.backend and args.backend != "local":
        engine = _engine(args.backend)
        os.environ.update(engine.start())
        os.environ["FIBER_BACKEND"] = args.backend
    try:
        return es.run(args.workers, args.out, args.iterations, args.population,
                      args.max_steps, args.threshold)
    finally:
        if engine is not None:
            engine.stop()


if __name__ == "__main__":
    sys.exit(main())
