"""The local backend's job records: a job one process created is found, ended and
released by another (what `fiber jobs` and `fiber clean` do), with real processes."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import uuid

import pytest

from fiber import host
from fiber.backend import JobSpec, JobState
from fiber.backend.local import records
from fiber.backend.local.backend import LocalBackend


@pytest.fixture
def labels():
    return {"fiber.run": "records-" + uuid.uuid4().hex[:8], "fiber.parent": "test"}


def test_another_instance_lists_terminates_and_releases_a_job(labels):
    creator, other = LocalBackend({}), LocalBackend({})
    try:
        job = creator.create_job(JobSpec(
            command=[sys.executable, "-c", "import time; print('up', flush=True); "
                     "time.sleep(300)"], name="sleeper", labels=labels))
        assert [j.id for j in other.list_jobs({"fiber.run": "someone-else"})] == []
        found, = other.list_jobs(labels)
        assert (found.id, found.spec.name, found.spec.labels) == (job.id, "sleeper", labels)
        assert other.status(found).state is JobState.RUNNING
        deadline = time.monotonic() + 30
        while "up" not in other.logs(found):  # the log is the creator's, readable by both
            assert time.monotonic() < deadline
            time.sleep(0.05)

        other.terminate(found, force=True)
        final = other.wait(found, 30)
        assert final is not None and (final.state, final.exitcode) == (JobState.CANCELLED, -9)
        mine = creator.wait(job, 30)  # the creator learns the real exit status
        assert mine is not None and mine.exitcode == -9

        other.release(found)
        assert other.list_jobs(labels) == [] and os.path.exists(job.handle.log_path)
        creator.release(job)  # the creator removes its own log
        assert creator.list_jobs(labels) == [] and not os.path.exists(job.handle.log_path)
    finally:
        creator.close()
        other.close()


def test_a_record_of_a_reused_pid_is_not_a_job(labels):
    """A record whose pid now belongs to another process (written by hand here: this
    test process, with a start time it never had) is not listed, and is deleted."""
    started = records.start_time(os.getpid())
    assert started is not None
    stale = os.path.join(records.directory(), f"{os.getpid()}-{started - 1}.json")
    os.makedirs(records.directory(), mode=0o700, exist_ok=True)
    with open(stale, "w") as f:
        json.dump({"pid": os.getpid(), "started": started - 1, "name": "stale",
                   "labels": labels, "log": "/nonexistent", "owner": 1,
                   "owner_started": None}, f)
    assert LocalBackend({}).list_jobs(labels) == []
    assert not os.path.exists(stale)


def test_a_directory_others_can_write_is_not_used(tmp_path, monkeypatch, caplog, labels):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # (the warning is said once per process: fiber.host's flag, reset for this test)
    monkeypatch.setattr(host, "_warned", False)
    shared = tmp_path / f"fiber-local-jobs-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    backend = LocalBackend({})
    try:
        with caplog.at_level(logging.WARNING, logger="fiber"):
            job = backend.create_job(JobSpec(command=[sys.executable, "-c", "pass"],
                                             labels=labels))
        assert list(shared.iterdir()) == []
        assert "is not a directory private to this user" in caplog.text
        assert backend.wait(job, 30) is not None
        # this instance still knows its own job
        assert [j.id for j in backend.list_jobs(labels)] == [job.id]
        backend.release(job)
    finally:
        backend.close()


def test_no_log_directory_is_left_behind(run_script, tmp_path):
    """The local backend's log directory (in TMPDIR) goes at exit once its jobs'
    logs are removed: in the program and in a child that starts its own child."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = run_script("""
        import fiber

        def grandchild():
            print("grandchild")

        def child():
            p = fiber.Process(target=grandchild)
            p.start()
            p.join()

        if __name__ == "__main__":
            p = fiber.Process(target=child)
            p.start()
            p.join()
            print("exit", p.exitcode)
    """, env={"TMPDIR": str(tmp)})
    assert out.returncode == 0, out.stderr
    assert "grandchild" in out.stdout and "exit 0" in out.stdout
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("fiber-local-logs-")) == []
