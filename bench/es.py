"""``python -m bench es``: the evolution-strategies demo's plot, from the benchmark suite.

It runs ``examples/es.py --plot`` (as a user would, in its own process) with the worker
counts asked for, and writes ``es.png`` (reward against wall time, each run from its own
start; time to reach a reward threshold against the number of workers) and ``es.json``
(every run's per-iteration records) into the output directory (default
``bench/results``). With ``--backend NAME`` the runs go to that backend's test engine
(started and stopped through ``tests/engines/NAME.py``, as ``python -m bench run
--backend`` does), e.g. 16 workers on the Slurm test cluster::

    python -m bench es --backend slurm --workers 16 --out bench/results/backends/slurm
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ES = REPO / "examples" / "es.py"


def command(workers: str, out_dir: Path, iterations: int, population: int, max_steps: int,
            threshold: float) -> list[str]:
    """The es.py command line of one comparison."""
    return [sys.executable, str(ES), "--plot", "--plot-workers", workers,
            "--plot-out", str(out_dir / "es.png"), "--json", str(out_dir / "es.json"),
            "--iterations", str(iterations), "--population", str(population),
            "--max-steps", str(max_steps), "--threshold", str(threshold)]


def run(workers: str, out_dir: Path, iterations: int, population: int, max_steps: int,
        threshold: float, timeout: float = 3600) -> int:
    """Run the comparison; returns es.py's exit status."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = command(workers, out_dir, iterations, population, max_steps, threshold)
    return subprocess.run(cmd, cwd=REPO, timeout=timeout).returncode
