"""Turning the engine's view of a container into a :class:`fiber.job.JobStatus`."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from fiber.backend import JobState, JobStatus

_LIVE = {"created": JobState.PENDING, "running": JobState.RUNNING,
         "restarting": JobState.RUNNING, "paused": JobState.RUNNING}


def signal_exitcode(code: int) -> int:
    """Map the ``128 + N`` an init process or the runtime reports for a job killed by
    signal N to ``-N`` (multiprocessing's convention); other codes are unchanged."""
    if 128 < code < 128 + signal.NSIG:
        return -(code - 128)
    return code


def _reason(exitcode: int, oom: bool, error: str) -> str | None:
    if oom:
        return "OOMKilled"
    if error:
        return error
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return None


def to_status(state: Mapping[str, Any], cancelled: bool = False) -> JobStatus:
    """``state`` is the ``State`` object of a container inspection."""
    status = str(state.get("Status", "")).lower()
    if status in _LIVE:
        return JobStatus(_LIVE[status])
    exitcode = signal_exitcode(int(state.get("ExitCode") or 0))
    oom = bool(state.get("OOMKilled"))
    if exitcode == 0 and not oom:
        return JobStatus(JobState.SUCCEEDED, 0)
    reason = _reason(exitcode, oom, str(state.get("Error") or ""))
    if cancelled and not oom:
        return JobStatus(JobState.CANCELLED, exitcode, reason)
    return JobStatus(JobState.FAILED, exitcode, reason)
