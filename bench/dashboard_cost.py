"""What an open dashboard page costs a program's ``map`` throughput (issue #39).

``python -m bench.dashboard_cost [ROUNDS] [--tasks N]``: this process holds a Pool of
4 local workers and times ``pool.map`` of N tiny tasks (chunksize 1), ROUNDS times with
no page open and ROUNDS times with one open (an event stream of ``fiber dashboard``,
started as a subprocess, which then asks this program for its snapshot every second),
the two kinds alternating so that the machine's load falls on both alike. Prints the
median tasks per second of each and their ratio (open / closed).
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import fiber


def noop(x: int) -> int:
    return x


class _Page:
    """An open page: an event stream read on a thread until closed."""

    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("GET", f"/events?token={token}")
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200, self.resp.status
        self.events = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        while self.events < 1:
            time.sleep(0.05)

    def _read(self) -> None:
        try:
            for line in self.resp.fp:
                self.events += line.startswith(b"data: ")
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.resp.close()
        self.conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, nargs="?", default=5)
    parser.add_argument("--tasks", type=int, default=20000)
    args = parser.parse_args()
    with fiber.Pool(4) as pool:
        pool.map(noop, range(1000), chunksize=1)  # warm
        dash = subprocess.Popen([sys.executable, "-m", "fiber.cli", "dashboard", "--pid",
                                 str(os.getpid()), "--port", "0"], stdout=subprocess.PIPE,
                                text=True)
        try:
            assert dash.stdout is not None
            found = None
            while found is None:
                line = dash.stdout.readline()
                if not line:
                    raise SystemExit("fiber dashboard printed no URL")
                found = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=(\S+)", line)
            port, token = int(found.group(1)), found.group(2)
            rates: dict[str, list[float]] = {"closed": [], "open": []}
            events = 0
            for _ in range(args.rounds):
                for kind in ("closed", "open"):
                    page = _Page(port, token) if kind == "open" else None
                    t0 = time.perf_counter()
                    pool.map(noop, range(args.tasks), chunksize=1)
                    rates[kind].append(args.tasks / (time.perf_counter() - t0))
                    if page is not None:
                        events += page.events
                        page.close()
                        time.sleep(7)  # the dashboard stops asking 5 s after a page left
        finally:
            dash.send_signal(signal.SIGINT)
            dash.wait(30)
    closed, opened = statistics.median(rates["closed"]), statistics.median(rates["open"])
    print(f"map of {args.tasks} tasks, {args.rounds} rounds each: no page "
          f"{closed:,.0f} tasks/s {[round(r) for r in rates['closed']]}; page open "
          f"{opened:,.0f} tasks/s {[round(r) for r in rates['open']]} "
          f"({events} snapshots sent); open/closed {opened / closed:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
