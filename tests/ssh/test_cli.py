"""``fiber jobs`` and ``fiber clean`` on the ssh backend against the real test hosts:
the jobs another process started are found on the hosts (by the id, name and labels
the backend puts in each job's environment), listed, and ended by ``fiber clean``; the
program that started them sees them end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

FIBER = [sys.executable, "-c", "import sys; from fiber.cli import main; sys.exit(main())"]

PROGRAM = textwrap.dedent("""
    import sys, time
    import fiber

    def sleep(seconds):
        time.sleep(seconds)

    if __name__ == "__main__":
        ps = [fiber.Process(target=sleep, args=(300,), name=f"sleeper-{i}")
              for i in range(3)]
        for p in ps:
            p.start()
        while any(p.pid is None for p in ps):
            time.sleep(0.05)
        from fiber.runtime import run
        print("run", run.run_id(), flush=True)
        for p in ps:
            print("job", p.job_id, p.host, flush=True)
        for p in ps:
            p.join()
        print("exitcodes", [p.exitcode for p in ps], flush=True)
""")


def fiber_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "FIBER_BACKEND": "ssh"}
    return subprocess.run([*FIBER, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_jobs_and_clean_find_another_programs_jobs(ssh_hosts, tmp_path):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    program = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "FIBER_BACKEND": "ssh"},
                               stdin=subprocess.DEVNULL)
    try:
        assert program.stdout is not None
        run = program.stdout.readline().split()[1]
        jobs = dict(program.stdout.readline().split()[1:] for _ in range(3))
        listed = fiber_cli("jobs", "--run", run)
        assert listed.returncode == 0, listed.stderr
        for job_id in jobs:
            assert re.search(rf"^{job_id}  running +run={run}  fiber-sleeper-\d$",
                             listed.stdout, re.M), listed.stdout
        assert len(listed.stdout.splitlines()) == 3, listed.stdout
        # the program's jobs are not anyone else's: another run id finds none
        other = fiber_cli("jobs", "--run", "no-such-run")
        assert other.stdout == "no fiber jobs of run no-such-run on the ssh backend\n"
        cleaned = fiber_cli("clean", "--run", run)
        assert cleaned.returncode == 0, cleaned.stderr
        assert sorted(line.split()[1] for line in cleaned.stdout.splitlines()) == sorted(jobs)
        out, err = program.communicate(timeout=60)
        assert "exitcodes [-9, -9, -9]" in out, (out, err)
        assert fiber_cli("jobs", "--run", run).stdout == (
            f"no fiber jobs of run {run} on the ssh backend\n")
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
