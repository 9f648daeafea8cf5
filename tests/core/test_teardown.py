"""Ending groups of jobs (issue #17): ``Backend.terminate_jobs``, and pools and
processes ended while the cluster manager does not answer.

Real jobs of the local backend throughout. The tests marked "faulty" put the test
plugin of ``tests/fault_plugin`` in front of it: its ``terminate`` hangs and then fails
as an unreachable cluster manager's would, while the jobs are real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import left_logs
from test_faults import faulty_env  # tests/core is on sys.path (rootdir conftest)

from fiber.backend import ClusterUnreachableError, Job, JobSpec
from fiber.backend.local.backend import LocalBackend


class _RefusesOne(LocalBackend):
    """The local backend, except that ending the job ``refused`` fails (a fake fault
    in front of real jobs)."""

    refused = ""

    def terminate(self, job: Job, force: bool = False) -> None:
        if job.id == self.refused:
            raise ClusterUnreachableError("injected: no answer for this one")
        super().terminate(job, force)


def test_terminate_jobs_ends_each_and_reports_the_errors():
    backend = _RefusesOne({})
    jobs = [backend.create_job(JobSpec(command=[sys.executable, "-c",
                                                "import time; time.sleep(60)"]))
            for _ in range(4)]
    try:
        backend.refused = jobs[2].id
        started = time.monotonic()
        errors = backend.terminate_jobs(jobs)
        assert time.monotonic() - started < 10
        assert list(errors) == [jobs[2].id]
        assert isinstance(errors[jobs[2].id], ClusterUnreachableError)
        for job in jobs[:2] + jobs[3:]:
            status = backend.wait(job, 30)
            assert status is not None and status.exitcode is not None, job.id
        assert not backend.status(jobs[2]).is_final  # the refused one still runs
        assert backend.terminate_jobs([]) == {}
    finally:
        backend.refused = ""
        backend.terminate_jobs(jobs, force=True)
        for job in jobs:
            backend.wait(job, 30)
            backend.release(job)
        backend.close()


POOL_ENDS = """
import os, time
import fiber

if __name__ == "__main__":
    pool = fiber.Pool(2)
    pool.map(abs, range(4))
    pids = [w.process.pid for w in pool.stats().workers]
    result = pool.map_async(time.sleep, [0.05] * 400, chunksize=1)
    started = time.monotonic()
    pool.terminate()
    pool.join()
    took = time.monotonic() - started
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    p = fiber.Process(target=time.sleep, args=(60,))
    p.start()
    # private read: the moment the child said hello, which no API shows
    while p.pid is None or not p._popen._connected:
        time.sleep(0.01)
    started = time.monotonic()
    p.terminate()
    p.join(10)
    print("pool took %.2f alive %s ready %s process took %.2f exitcode %s" % (
        took, alive, result.ready(), time.monotonic() - started, p.exitcode))
"""


def test_pool_and_process_end_while_the_cluster_does_not_answer(run_script):
    """faulty: every ``terminate`` of the backend hangs 20 s and then fails. A pool's
    terminate() and join(), and a Process's terminate() and join(), still take well
    under a second: connected jobs are told to end over their own connection. The
    workers' processes are gone, the hung calls do not hold the exit, and exit says
    nothing of jobs left running."""
    started = time.monotonic()
    result = run_script(POOL_ENDS, env=faulty_env(FAULTY_TERMINATE_DOWN="20"),
                        timeout=120)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert took < 10, f"the program took {took:.1f} s: a hung terminate held its exit"
    words = result.stdout.split()
    assert float(words[words.index("took") + 1]) < 2, result.stdout
    assert "alive []" in result.stdout and "ready True" in result.stdout, result.stdout
    assert float(words[-3]) < 2 and words[-1] == "-15", result.stdout
    assert "may still be running" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_terminate_of_an_unreachable_cluster_is_said_at_exit(tmp_path):
    """faulty: the cluster manager does not answer (``terminate`` and ``poll`` fail)
    and a daemonic child is not connected, so nothing can end its job: the program
    still exits within seconds, and its last warning names the job and says how to end
    it. (A fake: the script marks its connected child as not connected, standing for
    a job still queued in a cluster, which the local backend cannot make.)"""
    script = tmp_path / "main.py"
    script.write_text(
        "import os, signal, time\n"
        "import fiber\n"
        "if __name__ == '__main__':\n"
        "    p = fiber.Process(target=time.sleep, args=(60,), daemon=True)\n"
        "    p.start()\n"
        # private: a fault injected at the moment the child said hello (no API shows it)
        "    while not p._popen._connected:\n"
        "        time.sleep(0.01)\n"
        "    p._popen._connected = False  # as if it had not said hello yet\n"
        "    print(p.job_id, p.pid, flush=True)\n")
    tmpdir = left_logs.own_tmpdir(tmp_path)  # what the job's kill leaves is removed here
    env = {**os.environ, **faulty_env(FAULTY_TERMINATE_DOWN="0",
                                       FAULTY_POLL_OUTAGE="600"), "TMPDIR": tmpdir}
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path, stdin=subprocess.DEVNULL)
    took = time.monotonic() - started
    job_id, pid = done.stdout.split()
    try:
        assert done.returncode == 0, done.stderr
        assert took < 8, (took, done.stderr)
        assert "may still be running" in done.stderr and job_id in done.stderr
        assert "fiber clean" in done.stderr, done.stderr
    finally:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    left_logs.remove_left_logs(tmpdir)


FORGETFUL = """
import os, signal, time
import fiber

if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        assert pool.map(abs, range(-4, 0)) == [4, 3, 2, 1]
        result = pool.map_async(time.sleep, [0.01] * 600, chunksize=1)
        time.sleep(1.5)  # several polls, each saying the workers are LOST
        victim = [w.process.pid for w in pool.stats().workers][0]
        os.kill(victim, signal.SIGKILL)  # a real death: its connection drops
        result.get(60)
        stats = pool.stats()
        p = fiber.Process(target=time.sleep, args=(1.0,))
        p.start()  # (while the workers are forgotten)
        p.join(30)
    print("lost", stats.lost, "exitcode", p.exitcode)
"""


def test_connected_jobs_are_trusted_over_a_cluster_that_forgot_them(run_script):
    """faulty: half a second after the first status poll, the cluster forgets every job
    it had (a cluster manager restarted with its state wiped): polls say they are
    LOST. Connected, heartbeating workers are kept: the pool loses only the worker
    that was really killed, a Process ends with its own exit code, and one warning
    (not one per job or poll) says what fiber did."""
    result = run_script(FORGETFUL, env=faulty_env(FAULTY_POLL_FORGETS_AT="0.5"))
    assert result.returncode == 0, result.stderr
    assert "lost 1 exitcode 0" in result.stdout, result.stdout + result.stderr
    warnings = [line for line in result.stderr.splitlines() if "trusts the job" in line]
    assert len(warnings) == 1, result.stderr
