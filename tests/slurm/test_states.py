"""Pure unit tests of the Slurm state and exit code translation (no cluster needed;
the same values are checked end to end by the contract suite)."""

from __future__ import annotations

import pytest

from fiber.backend.job import JobState
from fiber_slurm.states import exitcode_from_pair, exitcode_from_wait_status, to_status


@pytest.mark.parametrize("raw, code", [(0, 0), (768, 3), (9, -9), (15, -15), (256 * 127, 127)])
def test_wait_status(raw, code):
    assert exitcode_from_wait_status(raw) == code


@pytest.mark.parametrize("text, code", [("0:0", 0), ("3:0", 3), ("0:9", -9), ("x", None)])
def test_exit_signal_pairs(text, code):
    assert exitcode_from_pair(text) == code


@pytest.mark.parametrize("state, exitcode, expected, reason", [
    ("PENDING", 0, JobState.PENDING, None),
    ("CONFIGURING", 0, JobState.PENDING, None),
    ("RUNNING", 0, JobState.RUNNING, None),
    ("COMPLETING", 0, JobState.RUNNING, None),
    ("COMPLETED", 0, JobState.SUCCEEDED, None),
    ("FAILED", 3, JobState.FAILED, "NonZeroExitCode"),
    ("FAILED", -9, JobState.FAILED, "SIGKILL"),
    ("OUT_OF_MEMORY", -9, JobState.FAILED, "OUT_OF_MEMORY"),
    ("TIMEOUT", -15, JobState.FAILED, "TIMEOUT"),
    ("CANCELLED by 0", -15, JobState.CANCELLED, "CANCELLED"),
    ("NODE_FAIL", None, JobState.LOST, "NODE_FAIL"),
    ("BOOT_FAIL", None, JobState.LOST, "BOOT_FAIL"),
    ("PREEMPTED", -15, JobState.LOST, "PREEMPTED"),
])
def test_states(state, exitcode, expected, reason):
    status = to_status(state, exitcode, "NonZeroExitCode")
    assert status.state is expected
    if reason is not None:
        assert status.reason == reason


def test_failed_never_reports_zero():
    assert to_status("FAILED", 0, "JobLaunchFailure").exitcode == 1


def test_cancelled_before_running_reports_sigterm():
    assert to_status("CANCELLED", 0).exitcode == -15
