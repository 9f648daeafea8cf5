"""Translating Slurm's job states and exit codes into fiber's :class:`JobStatus`."""

from __future__ import annotations

import signal

from fiber.backend import JobState, JobStatus

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
            "RESV_DEL_HOLD", "POWER_UP_NODE"}
_RUNNING = {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT",
            "RESIZING", "UPDATE_DB"}
#: states in which the job's batch step may not have been killed yet by a SIGKILL sent
#: to it (pending; running, or stopped, possibly before its batch step launched);
#: COMPLETING and later: its batch step has ended
_NOT_KILLED = _PENDING | {"RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"}
_FAILED = {"FAILED", "OUT_OF_MEMORY", "TIMEOUT", "DEADLINE", "SPECIAL_EXIT"}
_LOST = {"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REVOKED"}


def exitcode_from_wait_status(raw: int) -> int:
    """squeue's ``exit_code`` is a wait(2) status (negative: the signal that killed the
    job's script)."""
    return JobStatus.decode_exitcode(raw, "wait") or 0


def exitcode_from_pair(text: str) -> int | None:
    """scontrol's and sacct's ``ExitCode=exit:signal`` (signal wins, negative)."""
    try:
        code, _, sig = text.partition(":")
        code_i, sig_i = int(code), int(sig or 0)
    except ValueError:
        return None
    return -sig_i if sig_i else code_i


def may_still_run(state: str) -> bool:
    """Whether a job in Slurm's ``state`` may still run (or start): a SIGKILL sent to
    its batch step may have been dropped (see SlurmBackend._kill)."""
    return (state or "").split()[0].rstrip("+").upper() in _NOT_KILLED if state else False


def to_status(state: str, exitcode: int | None, reason: str | None = None,
              cancel_signal: int = signal.SIGTERM) -> JobStatus:
    """The fiber status of a Slurm job in ``state`` (e.g. ``"CANCELLED by 0"`` is
    accepted) with ``exitcode`` already converted (negative = signal).
    ``cancel_signal`` is reported (negative) for a job cancelled before it ran."""
    state = (state or "").split()[0].rstrip("+").upper() if state else ""
    slurm_reason = None if reason in (None, "", "None", "(null)") else reason
    if state in _PENDING:
        return JobStatus(JobState.PENDING, reason=slurm_reason)
    if state in _RUNNING:
        return JobStatus(JobState.RUNNING)
    if state == "COMPLETED":
        # (defensive: Slurm says COMPLETED only for exit 0)
        return JobStatus.from_exit(exitcode or 0, reason=slurm_reason)
    if state == "CANCELLED":
        # a job cancelled before it ran has no exit status: report the signal of the
        # cancel (SIGTERM, or SIGKILL for a forced one) as multiprocessing does
        return JobStatus.from_exit(exitcode, signal=None if exitcode else cancel_signal,
                                   cancelled=True, reason="CANCELLED")
    if state in _FAILED:
        if state in ("TIMEOUT", "DEADLINE", "OUT_OF_MEMORY"):
            why: str | None = state
        elif exitcode is not None and exitcode < 0:
            why = None  # the signal's name
        else:
            why = slurm_reason or state
        # Slurm says the job failed: never report exit status 0 (or none) for it
        return JobStatus.from_exit(exitcode or 1, failed=True, reason=why)
    if state in _LOST:
        return JobStatus(JobState.LOST, exitcode, state)
    # a state this version does not know: keep watching, say what Slurm says
    return JobStatus(JobState.RUNNING, reason=state or None)
