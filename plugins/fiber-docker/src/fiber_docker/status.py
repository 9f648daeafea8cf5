"""Turning the engine's view of a container into a :class:`fiber.job.JobStatus`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fiber.backend import JobState, JobStatus

_LIVE = {"created": JobState.PENDING, "running": JobState.RUNNING,
         "restarting": JobState.RUNNING, "paused": JobState.RUNNING}


def to_status(state: Mapping[str, Any], cancelled: bool = False) -> JobStatus:
    """``state`` is the ``State`` object of a container inspection; its ``ExitCode``
    says ``128 + N`` for a job killed by signal N, as a shell does. A job killed for
    memory failed, whoever ended it."""
    status = str(state.get("Status", "")).lower()
    if status in _LIVE:
        return JobStatus(_LIVE[status])
    oom = bool(state.get("OOMKilled"))
    return JobStatus.from_exit(int(state.get("ExitCode") or 0), encoding="shell",
                               cancelled=cancelled and not oom, failed=oom,
                               reason="OOMKilled" if oom else str(state.get("Error") or "") or None)
