"""What the results were measured on: machine, software versions, load."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

PACKAGES = ["fiber-core", "numpy", "pynng", "cloudpickle", "loky", "dask", "distributed",
            "ray", "ipyparallel", "pyspark", "psutil", "matplotlib"]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        out["java"] = (java.stderr or java.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        out["java"] = "not installed"
    return out


def describe() -> dict:
    """The machine's description for the results file."""
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": round(memory_gib(), 1),
        "platform": platform.platform(),
        "loadavg": list(os.getloadavg()),
        "versions": versions(),
    }
