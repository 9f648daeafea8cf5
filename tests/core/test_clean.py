"""``fiber clean`` and ``fiber jobs`` with several real programs on the local backend:
orphans are ended, live programs' jobs are left alone, and what a killed program left
on this machine (shared-memory segments, log directories) is removed.

Every program and command here runs with a temp directory of the test's own (TMPDIR),
so the CLI sees only the local jobs, run records and log directories of the test's
programs, never those of other fiber programs running on the machine. /dev/shm is
shared: the assertions name the test's own processes' segments only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from fiber.wire import shm

PROGRAM = """
import os, sys, time
import numpy as np
import fiber

def pid(_):
    time.sleep(0.05)
    return os.getpid()

def produce(q):
    for _ in range(5):
        q.put(np.ones(1 << 19))  # 4 MiB each: through shared-memory segments

if __name__ == "__main__":
    q = fiber.Queue()  # never read: its messages stay in their segments
    p = fiber.Process(target=produce, args=(q,))
    p.start()
    p.join()
    with fiber.Pool(2) as pool:
        workers = sorted(set(pool.map(pid, range(20))))
        print(os.environ["_FIBER_RUN"], os.getpid(), *workers, flush=True)
        sys.stdin.readline()  # until the test says so
        print(len(pool.map(pid, range(10))), flush=True)
"""


def _env(tmp: str) -> dict[str, str]:
    return {**os.environ, "TMPDIR": tmp, "FIBER_BACKEND": "local"}


def fiber_cli(tmp: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI with the test's temp directory and no terminal on stdin."""
    return subprocess.run([sys.executable, "-m", "fiber", *args], capture_output=True,
                          text=True, timeout=120, env=_env(tmp), stdin=subprocess.DEVNULL)


def _on_terminal(tmp: str, typed: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI with a pseudo-terminal on stdin (a real one: it may ask), ``typed``
    written to it."""
    import pty

    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fiber", *args], stdin=follower,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env(tmp))
        os.write(leader, typed.encode())
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(follower)
        os.close(leader)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _wait_for(predicate, timeout=60.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def _log_directories(tmp: str) -> list[str]:
    return sorted(n for n in os.listdir(tmp) if n.startswith("fiber-local-logs-"))


class Programs:
    """Real fiber programs started by the test; every one still running (and every
    job pid handed to ``track``) is killed at the end."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.pids: list[int] = []  # their jobs
        self.masters: list[int] = []

    def start(self, script: str) -> tuple[subprocess.Popen, str, int, list[int]]:
        proc = subprocess.Popen([sys.executable, script], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=self.tmp,
                                env=_env(self.tmp))
        self.procs.append(proc)
        run, master, *workers = proc.stdout.readline().split()
        assert len(workers) == 2, "the program did not start its pool"
        self.pids += [int(w) for w in workers]
        self.masters.append(int(master))
        return proc, run, int(master), [int(w) for w in workers]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:  # end of its stdin: it finishes and exits cleanly
                try:
                    proc.stdin.close()
                    proc.wait(60)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait(30)
        for pid in self.pids:  # (jobs are session leaders: their groups go too)
            if _alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        # what a program killed here left in /dev/shm (only files naming its processes)
        _wait_for(lambda: not any(_alive(pid) for pid in self.pids), 30, "the jobs to end")
        shm.sweep(self.masters + self.pids)


@pytest.fixture
def programs(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    started = Programs(str(tmp_path))
    started.script = str(script)
    yield started
    started.close()


def test_clean_ends_orphans_and_leaves_live_programs_alone(programs):
    """Two programs: one runs on, the other is killed with SIGKILL while one of its
    workers is frozen (SIGSTOP: it cannot notice its parent is gone, as a job stuck in
    a call or queued on a cluster). `fiber clean` ends the frozen orphan, leaves the
    live program's workers alone and says so, and removes the killed program's
    shared-memory segments and log directory; the live program goes on."""
    tmp = programs.tmp
    live, live_run, live_master, live_workers = programs.start(programs.script)
    killed, killed_run, killed_master, killed_workers = programs.start(programs.script)
    assert len(_log_directories(tmp)) == 2
    segments = shm.segments(killed_master)
    assert len(segments) >= 5, segments  # the queue's unread messages

    frozen, other = killed_workers
    os.kill(frozen, signal.SIGSTOP)
    killed.kill()
    assert killed.wait(30) == -signal.SIGKILL
    _wait_for(lambda: not _alive(other), what="the killed program's free worker to exit")
    time.sleep(1)
    assert _alive(frozen)

    listed = fiber_cli(tmp, "jobs")
    assert listed.returncode == 0, listed.stderr
    assert f"1 job of ended programs (runs {killed_run})" in listed.stdout, listed.stdout

    cleaned = fiber_cli(tmp, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    lines = cleaned.stdout.splitlines()
    assert lines[0] == f"removed {frozen}", cleaned.stdout
    assert lines[1].startswith("left alone 2 jobs of 1 run whose program is running"), lines
    assert f"{live_run} (2 jobs)" in lines[1] and "`fiber clean --run ID`" in lines[1]
    # (the log directory's job has ended now)
    assert lines[2].startswith("removed what ended programs left: "), lines
    assert "1 log directory" in lines[2], lines
    _wait_for(lambda: not _alive(frozen), 10, "the orphan to be gone")
    assert all(_alive(pid) for pid in live_workers)
    # the killed program's files are gone (whoever swept them: any fiber program's
    # start sweeps /dev/shm too); the live program's log directory stays
    assert shm.segments(killed_master) == []
    assert [d for d in _log_directories(tmp) if f"-{killed_master}-" in d] == []
    assert [d for d in _log_directories(tmp) if f"-{live_master}-" in d] != []

    # nothing more to end; the live program is untouched and works on
    again = fiber_cli(tmp, "clean")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("left alone 2 jobs of 1 run"), again.stdout
    live.stdin.write("go on\n")
    live.stdin.flush()
    assert live.stdout.readline() == "10\n"
    assert live.wait(60) == 0


def test_clean_run_removes_what_a_killed_program_left(programs):
    """After `kill -9` of a program whose jobs then exit on their own, `fiber clean
    --run ID` removes its log directory and its segments and says so (it used to say
    "nothing to clean" and leave them)."""
    tmp = programs.tmp
    killed, run, master, workers = programs.start(programs.script)
    assert shm.segments(master)
    killed.kill()
    killed.wait(30)
    _wait_for(lambda: not any(_alive(w) for w in workers), what="the workers to exit")
    listed = fiber_cli(tmp, "jobs")
    assert listed.stdout.startswith("no fiber jobs on the local backend\n"), listed.stdout
    assert "left by ended programs: " in listed.stdout and "1 log directory" in listed.stdout
    cleaned = fiber_cli(tmp, "clean", "--run", run)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.startswith("removed what ended programs left: "), cleaned.stdout
    assert "1 log directory" in cleaned.stdout
    assert _log_directories(tmp) == []
    assert shm.segments(master) == []
    assert os.listdir(os.path.join(tmp, f"fiber-runs-{os.getuid()}")) == []
    again = fiber_cli(tmp, "clean", "--run", run)
    assert again.stdout == f"no fiber jobs of run {run} on the local backend: nothing to clean\n"


def test_clean_all_asks_and_refuses_without_a_terminal(programs):
    """`fiber clean --all` would end a live program's jobs: with no terminal on stdin
    and no --yes it refuses, saying to pass --yes, and ends nothing; on a terminal
    (a pseudo-terminal) it asks, and "n" ends nothing; with --yes it ends them."""
    live, run, master, workers = programs.start(programs.script)
    refused = fiber_cli(programs.tmp, "clean", "--all")
    assert refused.returncode == 2
    assert "pass --yes" in refused.stderr, refused.stderr
    assert refused.stdout == ""
    time.sleep(0.5)
    assert all(_alive(pid) for pid in workers)

    # on a terminal it asks; anything but yes ends nothing
    answer = _on_terminal(programs.tmp, "n\n", "clean", "--all")
    assert answer.returncode == 1
    assert "2 fiber jobs of 1 run on the local backend" in answer.stdout, answer.stdout
    assert f"may still be running ({run})" in answer.stdout and "nothing ended" in answer.stdout
    assert all(_alive(pid) for pid in workers)

    ended = fiber_cli(programs.tmp, "clean", "--all", "--yes")
    assert ended.returncode == 0, ended.stderr
    assert sorted(int(line.split()[1]) for line in ended.stdout.splitlines()
                  if line.startswith("removed ") and line.split()[1].isdigit()) == workers
    _wait_for(lambda: not any(_alive(w) for w in workers), 10, "the workers to end")


def test_a_fiber_run_job_outliving_its_command_is_left_alone(tmp_path):
    """`fiber run`'s job is the program itself: when the `fiber run` process is killed
    with SIGKILL, its job still runs, so its run is live and `fiber clean` leaves it
    alone (only `--run ID` ends it)."""
    tmp = str(tmp_path)
    marker = tmp_path / "job.pid"
    runner = subprocess.Popen(
        [sys.executable, "-m", "fiber", "run", "--", sys.executable, "-c",
         f"import os, time; open({str(marker)!r}, 'w').write(f'{{os.getpid()}} "
         "{os.environ[\"_FIBER_RUN\"]}'); time.sleep(300)"],
        stdout=subprocess.DEVNULL, env=_env(tmp))
    job = None
    try:
        job, run = _wait_for(lambda: marker.exists() and marker.read_text().split(),
                             what="fiber run's job")
        job = int(job)
        runner.kill()
        runner.wait(30)
        cleaned = fiber_cli(tmp, "clean")
        assert cleaned.returncode == 0, cleaned.stderr
        assert cleaned.stdout.startswith(f"left alone 1 job of 1 run whose program is "
                                         f"running or not known to have ended: {run} "
                                         "(1 job)"), cleaned.stdout
        assert _alive(job)
        ended = fiber_cli(tmp, "clean", "--run", run)
        assert ended.stdout.splitlines()[0] == f"removed {job}", ended.stdout
        _wait_for(lambda: not _alive(job), 10, "the job to end")
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(30)
        if job is not None and _alive(job):
            os.killpg(job, signal.SIGKILL)
