"""The settings of the slurm backend and their parsers."""

from __future__ import annotations

import os
import re

from fiber.backend import ConfigOption, parse_positive_float


def parse_extra(text: str | list | tuple) -> list[str]:
    """Extra ``#SBATCH`` options: one per line or separated by ``;``, with or without
    the ``#SBATCH`` prefix, e.g. ``--exclusive;--nodes=1``."""
    items = text if isinstance(text, (list, tuple)) else re.split(r"[;\n]", str(text))
    options = []
    for item in items:
        item = str(item).strip()
        if item.startswith("#SBATCH"):
            item = item[len("#SBATCH"):].strip()
        if not item:
            continue
        if not item.startswith("-") or "\n" in item:
            raise ValueError(
                f"{item!r} is not an sbatch option: expected options such as "
                "'--exclusive;--nodes=1' (separated by ';' or newlines)"
            )
        options.append(item)
    return options


def parse_time(text: str) -> str:
    """A Slurm time limit: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    value = str(text).strip()
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", value, re.IGNORECASE):
        raise ValueError("expected a Slurm time limit such as 30, 1:00:00 or 2-12:00:00")
    return value


def default_log_dir() -> str:
    return os.path.join(os.path.expanduser("~"), ".fiber", "slurm")


OPTIONS = (
    ConfigOption("slurm_partition", str, None, "partition jobs are submitted to (sbatch --partition)"),
    ConfigOption("slurm_account", str, None, "account charged for the jobs (sbatch --account)"),
    ConfigOption("slurm_qos", str, None, "quality of service of the jobs (sbatch --qos)"),
    ConfigOption("slurm_time", parse_time, None, "time limit of each job (sbatch --time)"),
    ConfigOption("slurm_constraint", str, None, "node features required (sbatch --constraint)"),
    ConfigOption("slurm_extra", parse_extra, [],
                 "extra #SBATCH options, separated by ';' (e.g. --exclusive;--nodes=1)"),
    ConfigOption("slurm_log_dir", str, None,
                 "directory of the jobs' output files, shared by the submit host and the "
                 "compute nodes (default ~/.fiber/slurm)"),
    ConfigOption("slurm_bin_dir", str, None,
                 "directory of sbatch/squeue/scancel/scontrol (default: found on PATH)"),
    ConfigOption("slurm_poll_interval", parse_positive_float, 1.0,
                 "seconds between two squeue calls of the job monitor"),
)
