"""Named, tested outcomes for bad input: an unpicklable target, a job that cannot be
created, a child that dies before connecting back, a dead parent (no orphans)."""

from __future__ import annotations

import os
import pickle
import signal
import stat
import subprocess
import sys
import threading
import time

import left_logs
import pytest

import fiber
from fiber.errors import JobCreationError, ProcessStartError


def test_unpicklable_target_fails_at_start_without_a_job():
    lock = threading.Lock()
    p = fiber.Process(target=print, args=(lock,))
    with pytest.raises(pickle.PicklingError, match="must be picklable"):
        p.start()
    assert p not in fiber.active_children()


def test_job_that_cannot_be_created(fresh_config):
    fiber.init(python="/nonexistent/bin/python3")
    p = fiber.Process(target=print)
    with pytest.raises(JobCreationError, match="/nonexistent/bin/python3"):
        p.start()


def test_child_dying_before_it_connects(tmp_path, fresh_config):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no fiber here' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    fiber.init(python=str(fake))
    reader, writer = fiber.Pipe(duplex=False)
    p = fiber.Process(target=print, args=(writer,))
    p.start()
    writer.close()
    with pytest.raises(ProcessStartError, match="before it connected back") as info:
        p.join(60)
    assert info.value.exitcode == 3 and "no fiber here" in info.value.logs
    assert p.exitcode == 3
    # the pipe end it carried never arrived: the reader sees EOF, not a hang
    assert reader.poll(10)
    with pytest.raises(EOFError):
        reader.recv()
    # a pool whose workers cannot start fails its tasks instead of hanging
    pool = fiber.Pool(2)
    result = pool.map_async(abs, [-1, -2])
    with pytest.raises(ProcessStartError):
        result.get(60)
    with pytest.raises(ProcessStartError):
        pool.apply_async(abs, (1,))
    pool.terminate()


def test_children_exit_when_parent_is_killed(run_script, tmp_path):
    """The program is killed (SIGKILL): its children and pool workers exit, and the log
    directory its backend made, which it could not remove, is removed here (in a temp
    directory of its own: tests/left_logs.py)."""
    pidfile = tmp_path / "pids"
    tmpdir = left_logs.own_tmpdir(tmp_path)
    parent = subprocess.Popen([sys.executable, "-c", f"""
import time, fiber
if __name__ == "__main__":
    procs = [fiber.Process(target=time.sleep, args=(300,)) for _ in range(2)]
    for p in procs:
        p.start()
    q = fiber.Queue()
    pool = fiber.Pool(2)
    pids = pool.map(__import__("os").getpid.__call__.__class__.__call__, []) if False else []
    while any(p.pid is None for p in procs):
        time.sleep(0.05)
    time.sleep(1.5)  # the children have connected and run
    workers = [w.process.pid for w in pool.stats().workers if w.process]
    open({str(pidfile)!r}, "w").write(" ".join(str(x) for x in [p.pid for p in procs] + workers))
    time.sleep(300)
"""], cwd=tmp_path, env={**os.environ, "TMPDIR": tmpdir})
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.1)
    pids = [int(x) for x in pidfile.read_text().split()]
    assert len(pids) >= 3
    for pid in pids:
        os.kill(pid, 0)  # alive
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [pid for pid in pids if _alive(pid)]
    assert alive == [], f"orphans left: {alive}"
    left_logs.remove_left_logs(tmpdir)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of an exited child is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # (the latter: it ended while read)
        return False
