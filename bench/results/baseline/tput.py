"""Interleaved map(noop, range(N), chunksize=1) on fiber.Pool(2): this checkout against
fiber@378bcfd, fresh process per sample; wall seconds and the parent's CPU seconds.
Run from the repository root: PYTHONPATH=. python bench/results/baseline/tput.py [ROUNDS] (needs --baseline 378bcfd run once: its tree)"""
import json
import os
import statistics
import subprocess
import sys

from bench import baseline

N = 20000
CODE = ("import json,time,resource,fiber; from bench import tasks;"
        "p=fiber.Pool(2); p.map(tasks.noop, range(200), 1);"
        "r0=resource.getrusage(resource.RUSAGE_SELF); t=time.perf_counter();"
        f"p.map(tasks.noop, range({N}), 1); t=time.perf_counter()-t;"
        "r1=resource.getrusage(resource.RUSAGE_SELF); p.close(); p.join();"
        "print(json.dumps([t, (r1.ru_utime+r1.ru_stime)-(r0.ru_utime+r0.ru_stime)]))")
out = {"fiber": [], "fiber@378bcfd": []}
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 6):
    for name in (list(out) if i % 2 == 0 else list(out)[::-1]):
        front = baseline.pythonpath(name) if baseline.is_baseline(name) else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*front, os.getcwd()]))
        out[name].append(json.loads(subprocess.run([sys.executable, "-c", CODE], env=env,
                         check=True, capture_output=True, text=True).stdout))
for name, v in out.items():
    print(f"{name:14} tasks/s median {N / statistics.median(t for t, _ in v):,.0f}  "
          f"parent CPU us/task median {statistics.median(c for _, c in v) / N * 1e6:.1f}  n={len(v)}")
