"""The ``fiber`` command line on the local backend."""

from __future__ import annotations

import subprocess
import sys


def fiber_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fiber.cli", *args], capture_output=True,
                          text=True, timeout=120, **kw)


def test_backends_and_config():
    out = fiber_cli("backends")
    assert out.returncode == 0 and out.stdout.startswith("local") and "fiber-core" in out.stdout
    cfg = fiber_cli("config", env={"PATH": "/usr/bin:/bin", "FIBER_CPU": "3"})
    assert cfg.returncode == 0
    assert "cpu" in cfg.stdout and "3.0" in cfg.stdout and "(environment; FIBER_CPU)" in cfg.stdout


def test_run_streams_output_and_exit_code():
    out = fiber_cli("run", "--", sys.executable, "-c",
                    "import os; print('job says', os.environ['FIBER_BACKEND']); raise SystemExit(4)")
    assert out.returncode == 4
    assert "job says local" in out.stdout


def test_run_errors_are_messages():
    out = fiber_cli("run", "--backend", "nosuch", "--", "true")
    assert out.returncode == 1 and "no installed plugin provides" in out.stderr
    out = fiber_cli("run")
    assert out.returncode == 2


def test_run_ctrl_c_terminates_the_job(tmp_path):
    import os
    import signal
    import time

    marker = tmp_path / "child.pid"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fiber.cli", "run", "--", sys.executable, "-c",
         f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); "
         "print('ready', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child = int(marker.read_text())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 130
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the job outlived fiber run's Ctrl-C")
