"""How long N local workers take until each has run a task, with short tasks (no
long map leaving late workers idle, as the scale kind's 3 s map does), and where the
CPU goes: the master's per thread, the template's. From the repository root:
PYTHONPATH=. python bench/results/scale/start_all.py N (issue #29's 1,024 target)."""
import collections
import os
import sys
import threading
import time

import fiber
from bench import tasks

TICK = os.sysconf("SC_CLK_TCK")


def _cpu(path: str) -> float:
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main(n: int) -> None:
    names: dict[int, str] = {}
    last: dict[int, float] = {}
    stop = threading.Event()

    def watch() -> None:  # each thread's CPU, sampled until the end (threads end early)
        while not stop.is_set():
            for t in threading.enumerate():
                if t.native_id:
                    names[t.native_id] = t.name.rstrip("0123456789").rstrip("-_") or t.name
            for tid in os.listdir("/proc/self/task"):
                try:
                    last[int(tid)] = _cpu(f"/proc/self/task/{tid}/stat")
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, name="watch")
    watcher.start()
    t0, c0 = time.monotonic(), time.process_time()
    pool = fiber.Pool(n)
    seen: dict[int, float] = {}
    marks = {}
    while len(seen) < n and time.monotonic() - t0 < 300:
        for pid in pool.map(tasks.sleep_getpid, [0.05] * n, 1):
            seen.setdefault(pid, time.monotonic() - t0)
        for k in (64, 256, 512, 1024, n):
            if len(seen) >= k and k not in marks:
                marks[k] = round(time.monotonic() - t0, 1)
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    stop.set()
    watcher.join()
    kids = [int(x) for x in os.popen(f"pgrep -P {os.getpid()}").read().split()]
    template = sum(_cpu(f"/proc/{k}/stat") for k in kids)
    by = collections.Counter()
    for tid, c in last.items():
        by[names.get(tid, "ended")] += c
    print(f"{len(seen)} of {n} workers ran a task; seconds until k had: {marks}; total {wall:.1f} s")
    print(f"master CPU {cpu:.2f} s ({cpu / n * 1e3:.1f} ms per worker), template and other "
          f"children {template:.2f} s ({template / n * 1e3:.1f} ms per worker)")
    for name, c in by.most_common(8):
        print(f"  {name:28} {c / n * 1e3:6.2f} ms per worker")
    pool.terminate()
    pool.join()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1024)
