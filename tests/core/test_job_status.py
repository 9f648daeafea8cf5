"""``JobStatus.from_exit``: the one place an exit code or a signal becomes a job's
status, for every backend (pure unit tests of the contract type)."""

from __future__ import annotations

import signal

import pytest

from fiber.backend import JobState, JobStatus


@pytest.mark.parametrize("code, encoding, expected", [
    (0, "exitcode", 0), (3, "exitcode", 3), (-9, "exitcode", -9),
    (0, "shell", 0), (3, "shell", 3), (128, "shell", 128), (137, "shell", -9),
    (143, "shell", -15), (130, "shell", -2), (255, "shell", 255),
    (0, "wait", 0), (768, "wait", 3), (9, "wait", -9), (15, "wait", -15),
    (256 * 127, "wait", 127), (None, "shell", None),
])
def test_decode_exitcode(code, encoding, expected):
    assert JobStatus.decode_exitcode(code, encoding) == expected


def test_unknown_encoding_is_an_error():
    with pytest.raises(ValueError, match="unknown exit code encoding 'octal'"):
        JobStatus.decode_exitcode(3, "octal")  # type: ignore[arg-type]


def test_from_exit():
    assert JobStatus.from_exit(0) == JobStatus(JobState.SUCCEEDED, 0)
    assert JobStatus.from_exit(0, cancelled=True) == JobStatus(JobState.SUCCEEDED, 0)
    assert JobStatus.from_exit(2) == JobStatus(JobState.FAILED, 2)
    assert JobStatus.from_exit(-9) == JobStatus(JobState.FAILED, -9, "SIGKILL")
    assert JobStatus.from_exit(signal=signal.SIGTERM, cancelled=True) == \
        JobStatus(JobState.CANCELLED, -15, "SIGTERM")
    assert JobStatus.from_exit(137, encoding="shell") == \
        JobStatus(JobState.FAILED, -9, "SIGKILL")
    assert JobStatus.from_exit(9, encoding="wait", reason="TIMEOUT") == \
        JobStatus(JobState.FAILED, -9, "TIMEOUT")
    assert JobStatus.from_exit(0, failed=True, reason="OOMKilled") == \
        JobStatus(JobState.FAILED, 0, "OOMKilled")
    assert JobStatus.from_exit(-40) == JobStatus(JobState.FAILED, -40, "signal 40")
    # ended, exit status unknown
    assert JobStatus.from_exit(None) == JobStatus(JobState.FAILED, None)
    assert JobStatus.from_exit(None, cancelled=True) == JobStatus(JobState.CANCELLED, None)
