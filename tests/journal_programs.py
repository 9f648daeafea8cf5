"""Programs of the durable-pool tests (``fiber.Pool(journal=...)``), run as their own
processes by tests/core/test_journal.py and tests/ssh/test_journal.py, and the checks
those tests share.

``python tests/journal_programs.py map JOURNAL RUNS N [VERSION]`` maps ``square`` over
``range(N)`` on a durable pool of 2 workers; every task appends its item to the file
RUNS (one line, one ``write`` of an O_APPEND file: lines of concurrent workers do not
mix), so a test counts how often each item ran across runs. VERSION (default 1) is
part of the function's code: another VERSION is another version of the function. It
prints the sum of the results, and ``RESULTS <sha256 of the result list>``.
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import sys
import time

import fiber

VERSION = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[1] == "map" else 1
TASK_SECONDS = float(os.environ.get("JOURNAL_TEST_TASK_SECONDS", "0"))


def square(x: int) -> int:
    fd = os.open(os.environ["JOURNAL_TEST_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
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


def main() -> None:
    what, journal, runs_file, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.environ["JOURNAL_TEST_RUNS"] = runs_file
    assert what == "map"
    with fiber.Pool(2, journal=journal) as pool:
        print("STARTED", flush=True)
        values = pool.map(square, range(n), chunksize=int(os.environ.get(
            "JOURNAL_TEST_CHUNKSIZE", "1")))
    print(sum(values))
    print("RESULTS", digest(values), flush=True)


if __name__ == "__main__":
    main()
