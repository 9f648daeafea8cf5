"""How often the pool-lines Handoff (runtime/pool/lines.py) queues a handler to its helper
thread during map(noop, range(20000), chunksize=1) on fiber.Pool(2) (this checkout only).
From the repository root: PYTHONPATH=. python bench/results/baseline/handoff.py"""
import time

import fiber
import fiber.pool  # noqa: F401
from bench import tasks
from fiber.runtime.pool import lines

starts = [0]
made: list = []
_start = lines.threads.start
_init = lines.Handoff.__init__


def counting(kind, *args, **kwargs):
    if kind == "fiber-pool-lines":
        starts[0] += 1
    return _start(kind, *args, **kwargs)


def recording(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    made.append(self)


lines.threads.start = counting
lines.Handoff.__init__ = recording

if __name__ == "__main__":
    pool = fiber.Pool(2)
    pool.map(tasks.noop, range(200), 1)
    q0, s0 = sum(h.queued for h in made), starts[0]
    t = time.perf_counter()
    pool.map(tasks.noop, range(20000), 1)
    t = time.perf_counter() - t
    print(f"{20000 / t:,.0f} tasks/s; handlers queued {sum(h.queued for h in made) - q0}, "
          f"helper threads started {starts[0] - s0}")
    pool.close()
    pool.join()
