"""What ``fiber dashboard`` costs the program it watches (issue #39): ``python -m bench
run --quick --kinds dashboard`` (or ``python -m bench.dashboard_cost`` for the figures
alone).

This process is the program: it holds a ``Pool`` of local workers and runs ``map`` of
tiny tasks (``chunksize=1``, the pool's own overhead is all there is to measure) for
``dashboard_round_seconds`` per round, in three arms:

* **none**: no dashboard at all;
* **idle**: ``fiber dashboard --pid <this process>`` running (a subprocess, as a user
  starts it), no page open: it must ask the program nothing;
* **open**: one page open on it (its event stream, read on a thread here), so it asks
  the program for a snapshot every second.

The arms take turns, their order rotating each round, ``dashboard_rounds`` rounds, so
that the machine's load falls on all alike; each figure is the median over the rounds.
Before a round the program is checked quiet (no snapshot asked for a second and a half:
a dashboard keeps asking a few seconds after its last page closed). The snapshots the
program answered in each arm are counted where they are made (the status channel's
answer, wrapped by a counter, which also takes the CPU each answer cost): the idle
arm's count is the "no cost when nobody looks", and the answers' share of the
program's CPU in the open arm is a measure of the cost that the machine's load hardly
moves (on a loaded machine tasks/s spread by more than 5% between rounds of one arm).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ARMS = ("none", "idle", "open")
STORED = Path(__file__).resolve().parent / "results" / "dashboard" / "latest.json"
QUIET = 1.5  # seconds without a snapshot before a round (the dashboard asks every second)


def noop(x: int) -> int:
    return x


class _Dashboard:
    """``fiber dashboard`` of this process, as a subprocess."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fiber.cli", "dashboard", "--pid", str(os.getpid()),
             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        found = None
        while found is None:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("fiber dashboard printed no URL: "
                                   + (self.proc.stderr.read() if self.proc.stderr else ""))
            found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", line)
        self.port, self.token = int(found.group(1)), found.group(2)

    def stop(self) -> None:
        self.proc.terminate()  # (SIGTERM: a benchmark's children may have SIGINT ignored)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class _Page:
    """An open page: the dashboard's event stream, read on a thread until closed."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("GET", f"/events?token={token}")
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            raise RuntimeError(f"the dashboard's event stream answered {self.resp.status}")
        self.events = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.events < 1:  # the page has its first view: the dashboard is asking
            if time.monotonic() > deadline:
                raise RuntimeError("the page got no view within 30 s")
            time.sleep(0.02)

    def _read(self) -> None:
        try:
            for line in self.resp.fp:
                self.events += line.startswith(b"data: ")
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        sock = self.conn.sock
        if sock is not None:  # (the reading thread's read returns: close() waits for it)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.thread.join(10)
        self.resp.close()
        self.conn.close()


class _Counter:
    """Counts the status answers this program makes (the dashboard's questions), the
    CPU they took (each is answered on a thread of its own, whose CPU time is all the
    answer's: the pool's stats under its lock, their JSON, the reply) and when the last
    one was made. It wraps ``status._answer``, which the status channel looks up at
    each request (private: this benchmark measures it)."""

    def __init__(self) -> None:
        from fiber.runtime import status

        self.status = status
        self.real = status._answer
        self.count = 0
        self.cpu = 0.0
        self.last = 0.0
        status._answer = self._answer

    def _answer(self, request: Any, make: Any) -> None:
        began = time.thread_time()
        try:
            self.real(request, make)
        finally:
            self.cpu += time.thread_time() - began
            self.count += 1
            self.last = time.monotonic()

    def quiet(self, timeout: float = 20.0) -> None:
        """Wait until no snapshot was asked for :data:`QUIET` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() - self.last < QUIET:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the program was still asked after {timeout} s")
            time.sleep(0.1)

    def restore(self) -> None:
        self.status._answer = self.real


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _round(pool: Any, seconds: float, tasks: int) -> float:
    """Tasks per second of maps of ``tasks`` tasks, repeated for ``seconds``."""
    done = 0
    t0 = time.perf_counter()
    while True:
        pool.map(noop, range(tasks), chunksize=1)
        done += tasks
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed


def measure(cfg: dict) -> dict:
    """The three arms' median map throughput, their ratios to no dashboard, and the
    snapshots the program answered per arm (see the module)."""
    import fiber

    rounds, seconds = cfg["dashboard_rounds"], cfg["dashboard_round_seconds"]
    tasks = cfg["dashboard_tasks"]
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    asked = dict.fromkeys(ARMS, 0)
    answer_cpu = dict.fromkeys(ARMS, 0.0)  # the answers' CPU, seconds
    program_cpu = dict.fromkeys(ARMS, 0.0)  # this process's (the master's) CPU, seconds
    events = 0
    counter = _Counter()
    dash: _Dashboard | None = None
    try:
        with fiber.Pool(cfg["workers"]) as pool:
            pool.map(noop, range(tasks), chunksize=1)  # every worker up, warm
            for r in range(rounds):
                for arm in ARMS[r % 3:] + ARMS[:r % 3]:
                    if arm == "none" and dash is not None:
                        dash.stop()
                        dash = None
                    elif arm != "none" and dash is None:
                        dash = _Dashboard()
                    page = _Page(dash.port, dash.token) if arm == "open" and dash else None
                    if page is None:
                        counter.quiet()
                    before, cpu_before, own_before = counter.count, counter.cpu, _process_cpu()
                    try:
                        rates[arm].append(_round(pool, seconds, tasks))
                        program_cpu[arm] += _process_cpu() - own_before
                        answer_cpu[arm] += counter.cpu - cpu_before
                        asked[arm] += counter.count - before
                    finally:
                        if page is not None:
                            events += page.events
                            page.close()
            pool.terminate()
    finally:
        if dash is not None:
            dash.stop()
        counter.restore()
    medians = {arm: statistics.median(rates[arm]) for arm in ARMS}
    metrics: dict = {f"tasks_per_s/{arm}": medians[arm] for arm in ARMS}
    # each round's arms ran within seconds of each other: the median of the rounds'
    # ratios is the comparison least moved by the machine's load drifting between rounds
    for arm in ("idle", "open"):
        ratios = [a / b for a, b in zip(rates[arm], rates["none"], strict=True)]
        metrics[f"{arm}_over_none"] = statistics.median(ratios)
        metrics[f"{arm}_over_none/min"] = min(ratios)
        metrics[f"{arm}_over_none/max"] = max(ratios)
    for arm in ARMS:
        metrics[f"snapshots/{arm}"] = asked[arm]
    metrics["page_events"] = events
    if asked["open"]:
        metrics["answer_ms"] = 1000 * answer_cpu["open"] / asked["open"]
        # the share of the program's own CPU in the open rounds that the answers took: a
        # bound on their cost that the machine's load moves far less than tasks/s
        metrics["answer_cpu_share"] = answer_cpu["open"] / program_cpu["open"]
    metrics["spread/none"] = (max(rates["none"]) - min(rates["none"])) / medians["none"]
    return metrics


def section(data: dict) -> list[str]:
    """The dashboard's section of RESULTS.md: this run's rows, else those of
    :data:`STORED` (a run of this kind alone)."""
    source: list[str] = []
    if not data["summary"]["medians"].get("dashboard", {}).get("fiber"):
        stored = json.loads(STORED.read_text()) if STORED.exists() else None
        if not stored or not stored["summary"]["medians"].get("dashboard", {}).get("fiber"):
            return []
        data = stored
        source = [f"Not measured in this run: these rows are from a run of this kind alone, "
                  f"{data['meta']['date']}, load average {_load(data)} on "
                  f"{data['meta']['machine'].get('cpu_count', '?')} cores (`{data['meta']['command']}`, "
                  "bench/results/dashboard/).", ""]
    cfg = data["meta"]["config"]
    fiber = data["summary"]["medians"]["dashboard"]["fiber"]

    def row(arm: str, label: str, target: str, ok: bool | None) -> list[str]:
        ratio = fiber.get(f"{arm}_over_none")
        judged = "-" if ok is None else ("met" if ok else "**not met**") + f" ({target})"
        low, high = fiber.get(f"{arm}_over_none/min"), fiber.get(f"{arm}_over_none/max")
        spread = f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else ""
        return [label, f"{fiber.get(f'tasks_per_s/{arm}', 0):,.0f}",
                "1.000" if arm == "none" else (f"{ratio:.3f}{spread}" if ratio else "-"),
                f"{fiber.get(f'snapshots/{arm}', 0):.0f}", judged]

    idle_ok = fiber.get("snapshots/idle") == 0
    open_ratio = fiber.get("open_over_none")
    rows = [row("none", "no dashboard", "", None),
            row("idle", "`fiber dashboard` running, no page open", "no snapshot asked",
                idle_ok),
            row("open", "one page open", ">= 0.95", None if open_ratio is None
                else open_ratio >= 0.95)]
    out = ["## The dashboard's cost (issue #39)", "", *source,
           f"`Pool({cfg['workers']})` of local workers, `map` of {cfg['dashboard_tasks']:,} "
           f"tiny tasks (chunksize=1) repeated for {cfg['dashboard_round_seconds']:g} s per "
           f"round, the three arms in turn (order rotating), {cfg['dashboard_rounds']} "
           "rounds; tasks/s: the median of the rounds; / no dashboard: the median of the "
           "rounds' ratios to the same round's arm without a dashboard (their range in "
           "brackets). Snapshots: what the program answered its status clients "
           "during the arm's rounds (an open page asks one a second). The rounds without "
           f"a dashboard spread by {fiber.get('spread/none', 0):.1%} of their median "
           "(max - min): a difference smaller than that is noise.", "",
           "| arm | tasks/s | / no dashboard | snapshots | target |", "|---|---|---|---|---|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    share = fiber.get("answer_cpu_share")
    if share is not None:
        out += ["", f"With the page open, each answer took {fiber.get('answer_ms', 0):.2f} ms "
                "of the program's CPU (on the thread that answers it: the pool's stats "
                "under its lock, their JSON, the reply), one a second: "
                f"{share:.2%} of the CPU the program's own process spent in those rounds "
                "(the workers' apart). That share, unlike tasks/s, hardly moves with the "
                "machine's load."]
    return out + [""]


def _load(data: dict) -> str:
    start = (data["meta"].get("machine") or {}).get("loadavg")
    end = data["meta"].get("loadavg_end")
    values = [v[0] for v in (start, end) if v]
    return "-".join(f"{v:.1f}" for v in values) if values else "?"


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per round and arm")
    parser.add_argument("--tasks", type=int, default=5000, help="per map")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    got = measure({"dashboard_rounds": args.rounds, "dashboard_round_seconds": args.seconds,
                   "dashboard_tasks": args.tasks, "workers": args.workers})
    for key, value in got.items():
        print(f"{key}: {value:,.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
