"""Programs of the durable-pool tests (``fiber.Pool(journal=...)``), run as their own
processes by tests/core/test_journal.py and tests/ssh/test_journal.py, and the checks
those tests share.

``python tests/journal_programs.py map JOURNAL RUNS N [VERSION]`` maps ``square`` over
``range(N)`` (each item with the path RUNS) on a durable pool of 2 workers; every task
appends its item to the file RUNS (one line, one ``write`` of an O_APPEND file: lines of concurrent workers do not
mix), so a test counts how often each item ran across runs. VERSION (default 1) is
part of the function's code: another VERSION is another version of the function. It
prints the sum of the results, and ``RESULTS <sha256 of the result list>``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import fiber

VERSION = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[1] == "map" else 1
TASK_SECONDS = float(os.environ.get("JOURNAL_TEST_TASK_SECONDS", "0"))


def square(item: tuple[int, str]) -> int:
    """``x * x * VERSION`` of ``item = (x, RUNS)``, appending ``x`` to the file RUNS
    (an argument, not the environment: a cluster's job does not inherit it)."""
    x, runs_file = item
    fd = os.open(runs_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{x}\n".encode())
    finally:
        os.close(fd)
    if TASK_SECONDS:
        time.sleep(TASK_SECONDS)
    return x * x * VERSION


def expected(n: int, version: int = 1) -> list[int]:
    """What ``map`` computes, serially."""
    return [x * x * version for x in range(n)]


def digest(values: list[int]) -> str:
    return hashlib.sha256(pickle.dumps(values)).hexdigest()


def runs(path: str) -> collections.Counter[int]:
    """How often each item ran, by the file RUNS."""
    if not os.path.exists(path):
        return collections.Counter()
    with open(path) as f:
        return collections.Counter(int(line) for line in f if line.strip())


def kill_and_rerun(where: Any, points: int, env: dict[str, str],
                   left_running: Callable[[str], list[int]], n: int = 10_000,
                   grace: float = 30.0) -> None:
    """kill -9 of this program's master at ``points`` random moments of a map of ``n``
    tasks (each in a directory of its own under ``where``), then a re-run with the same
    journal: its results equal a serial run's, every item ran once or twice across
    both runs, and ``left_running(tag)`` (the processes of the killed run, found by the
    ``JOURNAL_TEST_TAG`` of their environment) is empty within ``grace`` seconds.
    ``JOURNAL_TEST_SEED`` repeats a sequence of moments."""
    want = digest(expected(n))
    seed = int(os.environ.get("JOURNAL_TEST_SEED", "0")) or random.randrange(1 << 30)
    rng = random.Random(seed)
    for point in range(points):
        journal, runs_file = f"{where}/j{point}.db", f"{where}/runs{point}"
        tag = f"fiber-journal-test-{os.getpid()}-{point}"
        run_env = {**os.environ, **env,
                   "JOURNAL_TEST_TASK_SECONDS": "0.0002", "JOURNAL_TEST_CHUNKSIZE": "8",
                   "JOURNAL_TEST_TAG": tag}
        command = [sys.executable, __file__, "map", journal, runs_file, str(n)]
        victim = subprocess.Popen(command, env=run_env, stdout=subprocess.PIPE, text=True)
        assert victim.stdout is not None
        assert victim.stdout.readline().strip() == "STARTED"
        moment = rng.uniform(0.0, 1.5)
        time.sleep(moment)
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        victim.stdout.close()
        where_ = f"seed {seed}, point {point}, killed {moment:.2f} s after the pool's start"
        out = subprocess.run(command, env={**run_env, "JOURNAL_TEST_TAG": tag + "-rerun"},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (where_, out.stderr[-3000:])
        assert out.stdout.split("RESULTS ")[1].split()[0] == want, where_
        counts = runs(runs_file)
        assert set(counts) == set(range(n)), where_
        assert max(counts.values()) <= 2, (where_, counts.most_common(3))
        deadline = time.monotonic() + grace
        while left_running(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left_running(tag), (where_, "left running")


def main() -> None:
    what, journal, runs_file, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    assert what == "map"
    with fiber.Pool(2, journal=journal) as pool:
        print("STARTED", flush=True)
        values = pool.map(square, [(x, runs_file) for x in range(n)],
                          chunksize=int(os.environ.get("JOURNAL_TEST_CHUNKSIZE", "1")))
    print(sum(values))
    print("RESULTS", digest(values), flush=True)


if __name__ == "__main__":
    main()
