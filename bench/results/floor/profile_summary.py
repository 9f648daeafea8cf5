"""Sum a ``py-spy record -f raw`` profile of profile_roundtrip.py by process and by what
the innermost fiber (or standard library) frame does (issue #19's round-trip note).

    python bench/results/floor/profile_summary.py RAW_FILE [PARENT_PID]
"""

from __future__ import annotations

import collections
import re
import sys

# (category, substrings of a frame): the innermost frame matching decides
CATEGORIES = (
    ("serialization", ("pickle", "serialization.py", "encode_", "decode_", "dumps", "loads",
                       "cloudpickle")),
    ("wire: send syscalls and framing", ("._send (", "sendall", ".send (fiber/wire/stream",
                                         "framing.py", "send_msg")),
    ("wire: receive syscalls and parsing", ("_read_frame", "read_directly", ".read (fiber/wire/stream",
                                            "recv")),
    ("selector thread / epoll", ("select (selectors", "selectors.py", "_serve_loop", "run (fiber/wire/stream/server")),
    ("thread hand-off (locks, waits)", ("wait (fiber/runtime/pool/results", "acquire", "Condition",
                                        "threading.py", "_wait (fiber/wire/stream")),
    ("scheduler bookkeeping", ("scheduler.py", "channel.py", "results.py", "pool.py", "workers.py")),
    ("the task itself", ("bench/tasks.py",)),
)


def main(path: str) -> None:
    per = collections.defaultdict(collections.Counter)
    leaves = collections.defaultdict(collections.Counter)
    for line in open(path):
        stack, _, n = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        who = "worker" if len(procs) > 1 else "parent"
        code = [f for f in frames if not f.startswith("process ")]
        if any("importlib" in f or "profile_roundtrip.py:3" in f for f in code):
            continue  # start-up and warm-up
        cat = "other"
        for f in reversed(code):
            hit = next((c for c, keys in CATEGORIES if any(k in f for k in keys)), None)
            if hit:
                cat = hit
                break
        per[who][cat] += int(n)
        leaves[who][code[-1] if code else "?"] += int(n)
    for who, c in per.items():
        total = sum(c.values())
        print(f"{who}: {total} samples")
        for cat, n in c.most_common():
            print(f"  {100 * n / total:5.1f}%  {cat}")
        print("  top frames:")
        for f, n in leaves[who].most_common(12):
            print(f"    {100 * n / total:5.1f}%  {re.sub(r'/work/.*?/src/', '', f)[:110]}")


if __name__ == "__main__":
    main(sys.argv[1])
