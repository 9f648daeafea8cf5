"""A job's Slurm batch script: the ``#SBATCH`` lines of a spec, in fiber's batch-script
template (:data:`fiber.backend.batch.SCRIPT_TEMPLATE`).

The sbatch options become ``#SBATCH`` lines (values double-quoted, as sbatch's
parser expects); the spec's environment becomes ``export NAME='value'`` lines and the
command is ``exec``'d (:mod:`fiber.backend.batch`).

A job array (:func:`render_array`: a group of specs that differ only in their
environment, one ``sbatch --array``) renders the same template: the variables all its
tasks share are exported as above, the others in a ``case`` on ``$SLURM_ARRAY_TASK_ID``
that gives each task the environment of its own spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

from fiber.backend import JobCreationError, JobSpec
from fiber.backend.batch import array_exports, exports, render_script

NAME_LABEL = "fiber.name"
#: the variable holding a task's index in a job array
ARRAY_INDEX = "SLURM_ARRAY_TASK_ID"


def job_name(labels: Mapping[str, str]) -> str:
    """The Slurm job name of a job with these labels: ``fiber-<run id>``, so that
    ``squeue --name`` / ``scancel --name`` find a whole run."""
    run = labels.get("fiber.run", "norun")
    return "fiber-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run)


def encode_comment(spec: JobSpec) -> str:
    """The job's ``--comment``: its labels and name, URL-encoded (no spaces, no ``|``)."""
    return urlencode({**spec.labels, NAME_LABEL: spec.name})


def decode_comment(comment: str) -> dict[str, str] | None:
    """Labels from a comment written by :func:`encode_comment`; None if not ours."""
    if not comment or comment == "(null)":
        return None
    try:
        labels = dict(parse_qsl(comment, keep_blank_values=True, strict_parsing=True))
    except ValueError:
        return None
    return labels if "fiber.run" in labels else None


def _directive(option: str, value: Any = None) -> str:
    if value is None:
        return f"#SBATCH {option}"
    text = str(value)
    if any(c in text for c in '"\n\r'):
        raise JobCreationError(f"cannot pass {option}={text!r} to sbatch: the value contains "
                               "a double quote or a line break")
    return f'#SBATCH {option}="{text}"'


#: the keys of ``Resources.extra["slurm"]`` (each an sbatch option of the same name)
RESOURCE_EXTRAS = frozenset({"partition", "account", "qos", "constraint", "reservation",
                             "nodelist", "exclude"})


def walltime_text(seconds: int) -> str:
    """``--time``'s ``D-HH:MM:SS`` for a number of seconds."""
    minutes, secs = divmod(int(seconds), 60)
    hours, mins = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}-{hours:02d}:{mins:02d}:{secs:02d}"


def sbatch_directives(spec: JobSpec, options: Mapping[str, Any], output: str) -> list[str]:
    """The ``#SBATCH`` lines of ``spec`` under the backend's ``options``."""
    lines = [
        _directive("--job-name", job_name(spec.labels)),
        _directive("--comment", encode_comment(spec)),
        _directive("--output", output),
        _directive("--open-mode", "append"),
        _directive("--export", "ALL"),
        # a fiber process runs once: after a node failure or a preemption the job ends
        # (LOST) and the parent decides (a Pool replaces the worker), no silent rerun
        _directive("--no-requeue"),
    ]
    if spec.cwd:
        lines.append(_directive("--chdir", spec.cwd))
    if spec.cpu:
        lines.append(_directive("--cpus-per-task", max(1, math.ceil(spec.cpu))))
    if spec.memory:
        lines.append(_directive("--mem", f"{int(spec.memory)}M"))
    if spec.gpu:
        lines.append(_directive("--gres", f"gpu:{int(spec.gpu)}"))
    if spec.walltime:
        lines.append(_directive("--time", walltime_text(spec.walltime)))
    # a job's own requests (Resources.extra["slurm"], in spec.extra) beat the settings
    extra = getattr(spec, "extra", None) or {}
    for key, flag in (("slurm_partition", "--partition"), ("slurm_account", "--account"),
                      ("slurm_qos", "--qos"), ("slurm_time", "--time"),
                      ("slurm_constraint", "--constraint")):
        if key == "slurm_time" and spec.walltime:
            continue
        value = extra.get(key[len("slurm_"):]) or options.get(key)
        if value:
            lines.append(_directive(flag, value))
    for key in ("reservation", "nodelist", "exclude"):
        if extra.get(key):
            lines.append(_directive(f"--{key}", extra[key]))
    for extra in options.get("slurm_extra") or []:
        if "\n" in extra or "\r" in extra:
            raise JobCreationError(f"slurm_extra option {extra!r} contains a line break")
        lines.append(f"#SBATCH {extra}")
    return lines


def render_array(specs: Sequence[JobSpec], options: Mapping[str, Any], output: str) -> str:
    """The batch script of a job array of ``specs`` (same command, resources, labels
    and working directory; any environment), task ``i`` running ``specs[i]``;
    ``output`` names each task's output file with ``%a`` for its task id."""
    first = specs[0]
    directives = sbatch_directives(first, options, output)
    directives.append(_directive("--array", f"0-{len(specs) - 1}"))
    return render_script(f"{first.name} (an array of {len(specs)})", directives,
                         array_exports([spec.env for spec in specs], ARRAY_INDEX),
                         first.command)


def render(spec: JobSpec, options: Mapping[str, Any], output: str,
           command: Sequence[str] | None = None) -> str:
    """The full batch script of ``spec``."""
    argv = list(command if command is not None else spec.command)
    return render_script(spec.name, sbatch_directives(spec, options, output),
                         exports(spec.env), argv)
