"""A program that ends right after its processes and pool did leaves no container:
at exit fiber waits for the backend to free the jobs it has joined, and frees what is
left itself."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import fiber
    from fiber.runtime.run import run_id

    def noop():
        pass

    def square(x):
        return x * x

    if __name__ == "__main__":
        print(run_id(), flush=True)
        procs = [fiber.Process(target=noop) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        with fiber.Pool(2) as pool:
            assert pool.map(square, range(10)) == [x * x for x in range(10)]
""")


def test_exit_leaves_no_container(engine_client, tmp_path):
    script = tmp_path / "main.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "FIBER_BACKEND": "docker"}
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = proc.stdout.split()[0]
    # no waiting: the program's exit is when its containers must be gone
    rows = engine_client.api.containers(all=True, filters={"label": f"fiber.run={run}"})
    assert [(row["Names"], row["State"]) for row in rows] == []
