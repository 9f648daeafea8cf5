"""``fiber top --once --json`` against a program whose Pool runs on the real Slurm test
cluster: a worker whose job Slurm keeps queued for lack of CPUs shows as *pending*
(the node has 64 CPUs and each worker asks for 40, so one of two runs and the other
waits in squeue), the running one as running, and tasks done grow. The program and
``fiber top`` run as a user would run them, in subprocesses with their own TMPDIR (so
only this program's registration is seen)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

PROGRAM = textwrap.dedent("""
    import os, sys, time
    import fiber

    def work(x):
        time.sleep(0.05)
        return x

    if __name__ == "__main__":
        stop = sys.argv[1]
        with fiber.Pool(2) as pool:
            results = [pool.apply_async(work, (i,)) for i in range(100000)]
            print("ready", flush=True)
            while not os.path.exists(stop):
                time.sleep(0.05)
            pool.terminate()
""")


def top_json(env) -> dict:
    out = subprocess.run([sys.executable, "-m", "fiber", "top", "--once", "--json"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_top_shows_a_queued_worker_as_pending(slurm_cluster, tmp_path):
    env = {**os.environ, "FIBER_BACKEND": "slurm", "FIBER_CPU": "40",
           "TMPDIR": str(tmp_path)}
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    stop = tmp_path / "stop"
    proc = subprocess.Popen([sys.executable, str(script), str(stop)], env=env,
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while True:
            snap = top_json(env)
            (pool,) = snap["pools"]
            workers = pool["workers"]
            if workers["running"] == 1 and workers["pending"] == 1 \
                    and pool["tasks"]["done"] > 0:
                break
            assert time.monotonic() < deadline, snap
            time.sleep(0.5)
        assert snap["program"]["backend"] == "slurm" and snap["program"]["pid"] == proc.pid
        assert workers["starting"] == 0 and workers["lost"] == 0
        # the queued worker is listed as the counts have it: pending (the dashboard's
        # per-worker state), not starting
        by_state = {w["state"]: w for w in pool["worker_list"]}
        assert "starting" not in by_state, pool["worker_list"]
        queued = by_state["pending"]["job_id"]
        # Slurm job ids: the two workers start as one job array, tasks <array>_<i>
        assert re.fullmatch(r"\d+(_\d+)?", queued)
        assert re.fullmatch(r"\d+(_\d+)?", by_state["busy"]["job_id"])
        squeue = subprocess.run(["squeue", "-h", "-r", "-j", queued, "-o", "%T"],
                                capture_output=True, text=True, check=True).stdout
        assert squeue.strip() == "PENDING"
        done = pool["tasks"]["done"]
        deadline = time.monotonic() + 60
        while top_json(env)["pools"][0]["tasks"]["done"] <= done:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        stop.touch()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert list((tmp_path / f"fiber-status-{os.getuid()}").glob("*.json")) == []
