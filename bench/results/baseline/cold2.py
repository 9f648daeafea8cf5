"""Where fiber.Pool(5)'s cold start goes: first pool in a fresh process (Pool() returns,
first result, all 5 workers ran a task) and a second pool in the same process; this
checkout against fiber@378bcfd, interleaved. From the repository root: PYTHONPATH=. python bench/results/baseline/cold2.py [ROUNDS]."""
import json
import os
import statistics
import subprocess
import sys

from bench import baseline

CODE = r'''
import json, time, fiber, tempfile
from bench import measure, contenders, tasks
import fiber.pool
out = []
for k in range(2):
    t0 = time.perf_counter(); p = fiber.Pool(5); t1 = time.perf_counter()
    p.apply_async(tasks.noop, (1,)).get(); t2 = time.perf_counter()
    seen = set()
    while len(seen) < 5:
        seen |= set(p.map(tasks.sleep_getpid, [0.05] * 5, 1))
    t3 = time.perf_counter(); p.close(); p.join()
    out.append([t1 - t0, t2 - t0, t3 - t0])
print(json.dumps(out))
'''
out = {"fiber": [], "fiber@378bcfd": []}
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for name in (list(out) if i % 2 == 0 else list(out)[::-1]):
        front = baseline.pythonpath(name) if baseline.is_baseline(name) else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*front, os.getcwd()]))
        out[name].append(json.loads(subprocess.run([sys.executable, "-c", CODE], env=env,
                         check=True, capture_output=True, text=True).stdout))
for name, v in out.items():
    for k, label in ((0, "first pool "), (1, "second pool")):
        med = [statistics.median(s[k][j] for s in v) for j in range(3)]
        print(f"{name:14} {label}: Pool() {med[0]*1000:6.1f} ms, first result {med[1]*1000:6.1f} ms, "
              f"all 5 ran {med[2]*1000:6.1f} ms (medians of {len(v)})")
