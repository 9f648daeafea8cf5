"""Import and start-up cost: ``import fiber`` against ``import multiprocessing``.

Each sample runs in a fresh interpreter (this Python, the benchmark's environment):

* import time: ``python -X importtime -c "import M"``, the cumulative time the
  interpreter reports for the top-level module ``M`` (milliseconds);
* process time: the wall time of ``python -c "import M"`` from starting the process
  to its exit, so interpreter start-up, the import and everything fiber does at exit;
  ``python -c pass`` is measured alongside as the floor.

The modules are measured interleaved (the order rotated every sample) so that changes
in machine load hit all of them alike; a repetition reports the median of its samples.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

MODULES = ("fiber", "multiprocessing")


def parse_importtime(stderr: str, module: str) -> float:
    """The cumulative import time of the top-level ``module`` in the output of
    ``python -X importtime``, in milliseconds."""
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3:
            continue
        name = parts[2][1:]  # one space after the bar; more is a nested import
        if name.rstrip() == module:
            try:
                return int(parts[1]) / 1000.0
            except ValueError:
                continue
    raise ValueError(f"`python -X importtime` did not report importing {module!r} "
                     "(already imported at start-up, or the import failed)")


def import_ms(module: str, python: str = sys.executable) -> float:
    """One fresh interpreter's import time of ``module``, in milliseconds."""
    done = subprocess.run([python, "-X", "importtime", "-c", f"import {module}"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"`import {module}` failed: {done.stderr.strip()[-500:]}")
    return parse_importtime(done.stderr, module)


def process_ms(code: str, python: str = sys.executable) -> float:
    """Wall time of ``python -c code`` from start to exit, in milliseconds."""
    t0 = time.perf_counter()
    done = subprocess.run([python, "-c", code], stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"`python -c {code!r}` exited {done.returncode}: "
                           f"{done.stderr.decode(errors='replace').strip()[-500:]}")
    return elapsed * 1000.0


def measure(samples: int, python: str = sys.executable) -> dict[str, float]:
    """Medians of ``samples`` interleaved samples: ``import_ms/M`` and ``process_ms/M``
    for each of :data:`MODULES`, and ``process_ms/python`` (``python -c pass``)."""
    scripts = {m: f"import {m}" for m in MODULES}
    scripts["python"] = "pass"
    for m in MODULES:  # untimed: byte-code caches written, files in the page cache
        import_ms(m, python)
    values: dict[str, list[float]] = {}
    names = list(scripts)
    for i in range(samples):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            if name in MODULES:
                values.setdefault(f"import_ms/{name}", []).append(import_ms(name, python))
            values.setdefault(f"process_ms/{name}", []).append(process_ms(scripts[name], python))
    return {key: statistics.median(v) for key, v in values.items()}
