"""The docker backend's pure functions (no engine needed): exit code and state
mapping, volume specs, finding this process's container in mountinfo. Only the
hostname is faked (in one test, which says so); the engine tests are elsewhere."""

from __future__ import annotations

import socket

import pytest

from fiber.backend.job import JobState, JobStatus
from fiber_docker.selfcontainer import own_container_id
from fiber_docker.status import to_status
from fiber_docker.volumes import Volume, is_under, parse_volume, parse_volumes


@pytest.mark.parametrize("code, expected", [(0, 0), (3, 3), (128, 128), (137, -9),
                                            (143, -15), (130, -2), (255, 255)])
def test_signal_exit_codes(code, expected):
    assert JobStatus.decode_exitcode(code, "shell") == expected


def test_states():
    assert to_status({"Status": "created"}) == JobStatus(JobState.PENDING)
    assert to_status({"Status": "running"}) == JobStatus(JobState.RUNNING)
    assert to_status({"Status": "paused"}) == JobStatus(JobState.RUNNING)
    assert to_status({"Status": "exited", "ExitCode": 0}) == JobStatus(JobState.SUCCEEDED, 0)
    assert to_status({"Status": "exited", "ExitCode": 0}, cancelled=True).state \
        is JobState.SUCCEEDED
    assert to_status({"Status": "exited", "ExitCode": 2}) == JobStatus(JobState.FAILED, 2)
    assert to_status({"Status": "exited", "ExitCode": 137}) == \
        JobStatus(JobState.FAILED, -9, "SIGKILL")
    assert to_status({"Status": "exited", "ExitCode": 143}, cancelled=True) == \
        JobStatus(JobState.CANCELLED, -15, "SIGTERM")
    assert to_status({"Status": "exited", "ExitCode": 137, "OOMKilled": True},
                     cancelled=True) == JobStatus(JobState.FAILED, -9, "OOMKilled")
    assert to_status({"Status": "dead", "ExitCode": 1, "Error": "boom"}) == \
        JobStatus(JobState.FAILED, 1, "boom")


def test_volume_forms():
    assert parse_volume("/a/b/:/c") == Volume("/a/b", "/c", False)
    assert parse_volume(" /a:/c:ro ") == Volume("/a", "/c", True)
    assert parse_volume("named:/c:rw") == Volume("named", "/c", False)
    assert not parse_volume("named:/c").is_bind
    assert parse_volumes("/a:/x, /b:/y:ro\n") == ["/a:/x:rw", "/b:/y:ro"]
    assert parse_volumes(["/a:/x"]) == ["/a:/x:rw"]
    assert parse_volumes("") == []
    for bad in ("", ":/x", "/a:", "a b:/x", "/a:/x:z"):
        with pytest.raises(ValueError, match="HOST_PATH:CONTAINER_PATH"):
            parse_volume(bad)


def test_is_under():
    assert is_under("/a/b", "/a") and is_under("/a", "/a") and is_under("/x", "/")
    assert not is_under("/ab", "/a")


def test_own_container_id_from_mountinfo(tmp_path, monkeypatch):
    """(The hostname is replaced by a stand-in to test the short-id fallback.)"""
    cid = "0123456789abcdef" * 4
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "27 1 254:0 / / rw - overlay overlay rw\n"
        f"40 27 254:0 /var/lib/docker/containers/{cid}/hostname /etc/hostname rw - ext4 "
        "/dev/vda rw\n"
    )
    dockerenv = tmp_path / ".dockerenv"
    assert own_container_id(str(mountinfo), str(dockerenv)) is None  # not in a container
    dockerenv.write_text("")
    assert own_container_id(str(mountinfo), str(dockerenv)) == cid
    mountinfo.write_text("27 1 254:0 / / rw - ext4 /dev/vda rw\n")
    monkeypatch.setattr(socket, "gethostname", lambda: "build-host")
    assert own_container_id(str(mountinfo), str(dockerenv)) is None
    monkeypatch.setattr(socket, "gethostname", lambda: "0123456789ab")
    assert own_container_id(str(mountinfo), str(dockerenv)) == "0123456789ab"
