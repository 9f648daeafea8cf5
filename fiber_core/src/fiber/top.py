"""``fiber top``: a live view of a running fiber program's pools.

It finds the programs of this user on this machine by their registrations
(:mod:`fiber.runtime.status`: a program writes one, private to the user, when it creates
its first Pool), attaches to one (``--pid``; by default the only one, else the newest)
over that program's own hub, authenticated with the run's secret the registration
holds, and shows per pool: workers by state (pending in the cluster's queue, starting,
running, stopping, lost, replaced), tasks queued, running, done and failed, throughput,
the slowest tasks in progress and the last errors with their remote tracebacks.
``--once --json`` prints one snapshot as JSON, for scripts. The live view reads single
keys without echoing them (:mod:`fiber.terminal`): ``q`` leaves, as Ctrl-C does; when
the program ends the view is erased and one line says so. "running" tasks are those in
progress, one per busy worker (the others a worker holds, sent in batches, are "held
ahead"); a slowest task's time is how long it has run so far.

The view is drawn with ``rich`` (fiber-core's ``top`` extra), imported only here; the
JSON output does not need it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from fiber.errors import AuthenticationError, ConnectionLostError, NotPrivateError, documented
from fiber.runtime import status

__all__ = ["INSTALL_HINT", "main"]

INSTALL_HINT = ("fiber top needs the rich package (fiber-core's `top` extra): from a "
                "clone of fiber, `pip install './fiber_core[top]'`; once fiber-core is "
                "on PyPI, `pip install 'fiber-core[top]'` (or just `pip install rich`); "
                "`fiber top --once --json` works without it")


@documented
class TopError(Exception):
    """What ``fiber top`` reports as a message (exit status 1)."""


def choose(pid: int | None) -> status.Program:
    """The program to attach to: the one of ``pid``, the only one, or the newest."""
    found = list(status.programs())
    if pid is not None:
        for program in found:
            if program.pid == pid:
                return program
        raise TopError(f"no running fiber program with pid {pid} has a pool "
                       f"(registered programs: {_pids(found)})")
    if not found:
        raise TopError("no running fiber program of this user has a pool (a program "
                       "registers in " f"{status.directory()} when it creates its first "
                       "Pool)")
    return found[0]


def _pids(found: list[status.Program]) -> str:
    return ", ".join(str(p.pid) for p in found) or "none"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _seconds(seconds: float) -> str:
    """``0.23 s``, ``4.1 s``, ``1:02:03``: precise enough for short tasks."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return _age(seconds)


def render(snap: dict[str, Any], others: list[status.Program]) -> Any:
    """The view of one snapshot, as a rich renderable."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    prog = snap["program"]
    head = Text()
    head.append(f"fiber top  pid {prog['pid']}", style="bold")
    head.append(f"  run {prog['run']}  backend {prog['backend']}  up "
                f"{_age(snap['time'] - prog['since'])}\n")
    head.append(" ".join(prog["argv"])[:200], style="dim")
    if others:
        head.append(f"\nother programs: {_pids(others)} (fiber top --pid PID)", style="dim")
    parts: list[Any] = [head]
    if not snap["pools"]:
        parts.append(Text("no pool (they were closed and collected)", style="dim"))
    for pool in snap["pools"]:
        w, t = pool["workers"], pool["tasks"]
        counts = Table.grid(padding=(0, 2))
        for _ in range(8):
            counts.add_column(justify="right")
        counts.add_row(*(Text(x, style="bold") for x in (
            "workers", "pending", "starting", "running", "busy", "stopping", "lost",
            "replaced")))
        counts.add_row(str(pool["processes"]), str(w["pending"]), str(w["starting"]),
                       str(w["running"]), str(w["busy"]), str(w["stopping"]),
                       str(w["lost"]), str(w["replaced"]))
        counts.add_row(*(Text(x, style="bold") for x in (
            "tasks", "queued", "running", "held ahead", "done", "failed", "tasks/s",
            "s/task")))
        mean = pool.get("task_seconds")
        counts.add_row("", str(t["queued"]), str(t["running"]),
                       str(max(0, t["held"] - t["running"])), str(t["done"]),
                       str(t["failed"]), f"{pool['throughput']:.1f}",
                       "-" if mean is None else _seconds(mean))
        body: list[Any] = [counts]
        adapt = pool.get("adapt")
        if adapt:
            text = Text()
            text.append(f"adapting [{adapt['minimum']}, {adapt['maximum']}] idle timeout "
                        f"{adapt['idle_timeout']:g} s, growth {adapt['growth']:g}: "
                        f"wanted {adapt['wanted']}", style="bold")
            for i, place in enumerate(adapt.get("placements") or ()):
                skipped = (f", skipped for {place['skipped']:g} s" if place["skipped"]
                           else "")
                text.append(f"\n  placement {i} {place['name']} (max {place['maximum']}): "
                            f"wanted {place['wanted']}, pending {place['pending']}, "
                            f"starting {place['starting']}, busy {place['busy']}, "
                            f"idle {place['idle']}{skipped}")
            for when, reason in adapt["decisions"][-3:]:
                text.append(f"\n{time.strftime('%H:%M:%S', time.localtime(when))} {reason}",
                            style="dim")
            body.append(text)
        if pool["slowest"]:
            slow = Table(title="slowest running tasks", title_justify="left",
                         expand=True, box=None)
            slow.add_column("worker", justify="right")
            slow.add_column("running for", justify="right")
            slow.add_column("task", overflow="ellipsis", no_wrap=True)
            for entry in pool["slowest"]:
                slow.add_row(str(entry["worker"]), _seconds(entry["seconds"]),
                             entry["task"])
            body.append(slow)
        for error in pool["errors"][-3:]:
            text = Text()
            text.append(f"{time.strftime('%H:%M:%S', time.localtime(error['time']))} "
                        f"{error['error']}", style="bold red")
            text.append(f"  ({error['task']})\n", style="dim")
            tail = error["traceback"].splitlines()[-8:]
            text.append("\n".join(tail), style="red")
            body.append(text)
        parts.append(Panel(Group(*body), title=f"Pool {pool['id']} ({pool['state']})",
                           title_align="left"))
    return Group(*parts)


def _snapshot(program: status.Program, timeout: float = 10.0) -> dict[str, Any]:
    try:
        return status.query(program, timeout)
    except AuthenticationError as exc:
        raise TopError(f"program {program.pid} refused the secret of its "
                       f"registration: {exc}") from None


QUIT_KEYS = ("q", "Q")
QUERY_TIMEOUT = 2.0  # seconds a refresh waits for the program's answer (q waits as long)
HELP = "q: quit (Ctrl-C too)"


def main(args: argparse.Namespace) -> int:
    """``fiber top`` with its parsed options (``pid``, ``once``, ``json``, ``interval``)."""
    if args.json and not args.once:
        raise TopError("--json prints one snapshot: use it with --once")
    if not args.json:
        try:
            import rich  # noqa: F401 - only checks that the view can be drawn
        except ImportError:
            raise TopError(INSTALL_HINT) from None
    program = choose(args.pid)
    try:
        snap = _snapshot(program)
    except ConnectionLostError as exc:
        raise TopError(f"cannot reach program {program.pid}: {exc}") from None
    if args.json:
        print(json.dumps(snap, indent=2))
        return 0
    others = [p for p in status.programs() if p.pid != program.pid]
    from rich.console import Console

    console = Console()
    if args.once:
        console.print(render(snap, others))
        return 0
    try:
        return _live(console, program, snap, others, args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()


def _live(console: Any, program: status.Program, snap: dict[str, Any],
          others: list[status.Program], interval: float) -> int:
    """The view, refreshed every ``interval`` seconds until ``q`` (or Ctrl-C) or the
    program's end. Typed keys are not echoed into it (:class:`fiber.terminal.Keys`); it
    is erased when it ends, and a line says why it ended."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from fiber.terminal import Keys

    def view(snap: dict[str, Any]) -> Any:
        return Group(render(snap, others), Text(HELP, style="dim"))

    with Keys() as keys, Live(view(snap), console=console, auto_refresh=False,
                              screen=False, transient=True) as live:
        while True:
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0:
                if any(key in QUIT_KEYS for key in keys.wait(min(left, 0.1))):
                    return 0
            try:
                snap = _snapshot(program, QUERY_TIMEOUT)
            except ConnectionLostError:
                if not program.alive():
                    live.stop()
                    console.print(f"fiber top: program {program.pid} has ended")
                    return 0
                continue  # busy: try again at the next refresh
            live.update(view(snap), refresh=True)


def list_programs() -> int:
    found = list(status.programs())
    if not found:
        print("no running fiber program of this user has a pool")
    for p in found:
        print(f"{p.pid}  run={p.run}  up {_age(time.time() - p.since)}  "
              f"{' '.join(p.argv)[:120]}")
    return 0


def command(args: argparse.Namespace) -> int:
    """The entry of ``fiber top`` (errors are messages on stderr, exit status 1)."""
    try:
        if args.list:
            return list_programs()
        return main(args)
    except (TopError, NotPrivateError) as exc:
        print(f"fiber top: {exc}", file=sys.stderr)
        return 1
