"""A job that runs another fiber is refused at its hello, quickly and clearly.

The job here really runs another fiber: a copy of this ``fiber`` package whose
``_version.py`` says another version, put first on the job's ``PYTHONPATH`` by a small
wrapper given as the ``python`` setting. Each case runs a script in a fresh interpreter
on the local backend and checks that the parent raises
:class:`fiber.ProcessStartError` naming both versions well before the heartbeat
timeout (30 s), that the job's own output (what a backend's log shows a user) says in
one line why it stopped, and that no process is left: every process of the script
inherits a unique token in its environment, looked up in /proc.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
from procs import processes_with

import fiber
from fiber import _version

OTHER_VERSION = "0.0.1.other"


@pytest.fixture
def other_python(tmp_path: Path) -> str:
    """An executable that runs this Python with a copy of fiber of another version
    first on its path."""
    package = Path(fiber.__file__).parent
    site = tmp_path / "other-fiber"
    copy = site / "fiber"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    version_file = copy / "_version.py"
    text = version_file.read_text()
    changed = re.sub(r'__version__ = "[^"]*"', f'__version__ = "{OTHER_VERSION}"', text)
    assert changed != text and _version.__version__ != OTHER_VERSION
    version_file.write_text(changed)
    wrapper = tmp_path / "python-other"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        "export PYTHONPATH\n"
        f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


# The script reports as one JSON line. The backend's log of each job is read just
# before the backend frees the job (the local backend deletes the log file then): it
# is the output a user would look at.
PRELUDE = """
    import json
    import time

    import fiber
    from fiber.backend.local.backend import LocalBackend

    JOB_LOGS = []
    _release = LocalBackend.release

    def _keep_log(self, job):
        JOB_LOGS.append(self.logs(job))
        _release(self, job)

    LocalBackend.release = _keep_log

    def noop(x=None):
        return x

    def failure(exc, t0):
        return {"elapsed": time.monotonic() - t0, "type": type(exc).__name__,
                "reason": getattr(exc, "reason", None), "message": str(exc)}
"""

PROCESS = PRELUDE + """
    if __name__ == "__main__":
        fiber.init(python=JOB_PYTHON)
        report = {}
        p = fiber.Process(target=noop)
        t0 = time.monotonic()
        p.start()
        try:
            p.join(60)
        except Exception as exc:
            report = failure(exc, t0)
        report["children"] = len(fiber.active_children())
        report["exitcode"] = p.exitcode
        deadline = time.monotonic() + 10
        while not JOB_LOGS and time.monotonic() < deadline:
            time.sleep(0.05)
        report["job_logs"] = JOB_LOGS
        print(json.dumps(report))
"""

POOL = PRELUDE + """
    if __name__ == "__main__":
        fiber.init(python=JOB_PYTHON)
        report = {}
        t0 = time.monotonic()
        pool = fiber.Pool(2)
        try:
            report["result"] = pool.map(noop, range(10))
        except Exception as exc:
            report = failure(exc, t0)
        pool.terminate()
        pool.join()
        report["children"] = len(fiber.active_children())
        print(json.dumps(report))
"""


def _run(run_script, code: str, python: str) -> dict:
    """Run ``code`` with ``python`` as the jobs' Python; the report it printed."""
    token = uuid.uuid4().hex
    env = {"FIBER_BACKEND": "local", "VERSION_TEST_TOKEN": token}
    code = code.replace("import json", f"import json\n    JOB_PYTHON = {python!r}", 1)
    result = run_script(code, env=env, timeout=120)
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token) == [], "processes of the script are still running"
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_names_both_versions(message: str) -> None:
    assert f"fiber {OTHER_VERSION}" in message, message
    assert f"fiber {_version.__version__}" in message, message


def test_a_process_whose_job_runs_another_fiber_fails_to_start(run_script, other_python):
    out = _run(run_script, PROCESS, other_python)
    assert out.get("type") == "ProcessStartError", out
    assert out["reason"] == "version mismatch"
    _assert_names_both_versions(out["message"])
    assert out["elapsed"] < 15, "refused only after a timeout"
    assert out["children"] == 0
    assert out["exitcode"] == 1
    # the job said why it stopped, in one line, and printed no traceback
    (log,) = out["job_logs"]
    assert "Traceback" not in log, log
    (line,) = log.strip().splitlines()
    assert line.startswith("fiber: ") and "refused" in line, line
    _assert_names_both_versions(line)


def test_a_pool_whose_workers_run_another_fiber_breaks(run_script, other_python):
    out = _run(run_script, POOL, other_python)
    assert "result" not in out, out
    assert out.get("type") == "ProcessStartError", out
    assert out["reason"] == "version mismatch"
    _assert_names_both_versions(out["message"])
    assert out["elapsed"] < 30, "the pool broke only after a timeout"
    assert out["children"] == 0


WHICH_FIBER = PRELUDE + """
    def where(q):
        q.put((fiber.__file__, fiber.__version__))

    if __name__ == "__main__":
        fiber.init(python=JOB_PYTHON)
        q = fiber.Queue()
        p = fiber.Process(target=where, args=(q,))
        p.start()
        file, version = q.get(timeout=60)
        p.join(60)
        print(json.dumps({"file": file, "version": version, "exitcode": p.exitcode}))
"""


def test_the_wrapper_runs_the_copy(run_script, other_python):
    """With the copy's version set back to this one, the job runs, from the copy: the
    failures above come from the version alone."""
    site = Path(other_python).parent / "other-fiber"
    (site / "fiber" / "_version.py").write_text(f'__version__ = "{_version.__version__}"\n')
    out = _run(run_script, WHICH_FIBER, other_python)
    assert out["file"] == str(site / "fiber" / "__init__.py")
    assert out["version"] == _version.__version__
    assert out["exitcode"] == 0
