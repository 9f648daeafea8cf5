"""A run of ``examples/es.py`` on a cluster backend, watched from ``fiber dashboard``
(issue #39): the ES demo runs as a user runs it (its own process, ``FIBER_BACKEND=ssh``,
8 workers as jobs on the SSH test hosts, network namespaces with their own sshd that
tests/engines/ssh.py starts and stops here), ``fiber dashboard --pid <es.py>`` serves
its page, and headless Chromium (tests/dashboard_page.py) checks that the pool's
workers appear, by host, and that its throughput shows and grows: the rate, the done
count, the plot and the task-time histogram of ``evaluate``.

Its last screenshot is the documentation's picture of a cluster run
(docs/images/fiber-dashboard-es-ssh.png): ``DASHBOARD_ES_SCREENSHOT=PATH`` copies it
there (``DASHBOARD_ES_SECONDS`` of history first, default 20)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dashboard_page import Dashboard, attribute_of, chromium, text_of, wait_until

pytest.importorskip("gymnasium", reason="the ES demo needs examples/requirements.txt")
pytest.importorskip("fiber_ssh", reason="the ssh run needs plugins/fiber-ssh")
pytest.importorskip("selenium", reason="the browser test needs selenium")

REPO = Path(__file__).resolve().parents[2]
WORKERS = 8


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def ssh_engine():
    """The SSH test hosts: their FIBER_SSH_* settings, and a function listing the
    processes in the hosts' namespaces other than their sshds."""
    engine = _load("fiber_bench_test_engine_ssh", REPO / "tests" / "engines" / "ssh.py")
    hosts = _load("fiber_bench_test_hosts", REPO / "scripts" / "engines" / "ssh" / "hosts.py")
    settings = engine.start()
    try:
        state = json.loads(Path(settings["FSSH_TEST_STATE"]).read_text())

        def left() -> list[int]:
            return [pid for pid in hosts.pids_in_namespaces(state["namespaces"])
                    if pid not in set(state["sshd_pids"])]
        yield settings, left
    finally:
        engine.stop()


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


def _registered(pid: int) -> bool:
    from fiber.runtime import status

    return any(p.pid == pid for p in status.programs())


def test_an_es_run_on_the_ssh_hosts_is_watched_from_the_dashboard(ssh_engine, browser,
                                                                   tmp_path):
    settings, left = ssh_engine
    env = {**os.environ, **settings, "FIBER_BACKEND": "ssh"}
    # more iterations than the test watches: it is stopped with Ctrl-C once seen
    es = subprocess.Popen([sys.executable, str(REPO / "examples" / "es.py"), "--workers",
                           str(WORKERS), "--iterations", "10000", "--population", "32",
                           "--max-steps", "200"], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dash = None
    try:
        wait_until("es.py's registration (its Pool)", lambda: _registered(es.pid)
                   or es.poll() is not None, 120)
        assert es.poll() is None, es.stdout.read()
        dash = Dashboard(pid=es.pid)
        driver = browser
        driver.get(dash.url)
        pid = wait_until("the pool's card", lambda: driver.execute_script(
            "const e = document.querySelector('[id^=pool-][id$=-w-running]');"
            "return e ? Number(e.id.split('-')[1]) : null;"), 30, driver,
            tmp_path / "fail-load.png")
        assert "backend ssh" in (text_of(driver, "program") or "")

        # its workers: all 8 running, on both hosts
        wait_until("8 running workers", lambda: text_of(driver, f"pool-{pid}-w-running")
                   == str(WORKERS), 180, driver, tmp_path / "fail-workers.png")

        def by_host() -> dict[str, int]:
            return dict(driver.execute_script(
                "return [...document.querySelectorAll(arguments[0])]"
                ".map(r => [r.cells[0].textContent, Number(r.cells[1].textContent)]);",
                f"#pool-{pid}-by-host tbody tr"))
        hosts = wait_until("the workers on both hosts", lambda: (
            (h := by_host()) and set(h) == {"h1", "h2"} and sum(h.values()) == WORKERS
            and h), 30, driver, tmp_path / "fail-hosts.png")
        listed = driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].length;",
            f"#pool-{pid}-workers tr[data-worker]")
        assert listed == WORKERS, listed

        # its throughput: a rate above 0, the done count and the rate plot growing, and
        # the task times of its one function
        def done() -> int:
            return int(text_of(driver, f"pool-{pid}-t-done") or 0)

        def rate_points() -> int:
            return int(attribute_of(driver, f"pool-{pid}-rate", "data-points") or 0)
        wait_until("a throughput above 0", lambda: float(
            text_of(driver, f"pool-{pid}-t-per_second") or 0) > 0, 60, driver,
            tmp_path / "fail-rate.png")
        first, points = done(), rate_points()
        wait_until("more tasks done", lambda: done() >= first + 32, 60, driver,
                   tmp_path / "fail-done.png")
        assert rate_points() > points
        title = wait_until("the histogram of evaluate", lambda: (
            t := text_of(driver, f"pool-{pid}-hist-0") or "").startswith("evaluate:") and t,
            10, driver, tmp_path / "fail-hist.png")
        assert int(title.split(": ")[1].split(" tasks")[0]) > 0, title
        time.sleep(float(os.environ.get("DASHBOARD_ES_SECONDS", "20")))
        shot = tmp_path / "es-ssh.png"
        driver.save_screenshot(str(shot))
        assert es.poll() is None, "es.py ended before it was seen"
        if os.environ.get("DASHBOARD_ES_SCREENSHOT"):
            shutil.copyfile(shot, os.environ["DASHBOARD_ES_SCREENSHOT"])
        print(f"workers by host {hosts}, {done()} tasks done")
    finally:
        if dash is not None:
            dash.stop()
        if es.poll() is None:
            es.send_signal(signal.SIGINT)  # as a user stops it: its pool ends its jobs
            try:
                es.wait(60)
            except subprocess.TimeoutExpired:
                es.kill()
                es.wait()
        es.stdout.close()
    assert dash.proc.returncode == 0, dash.proc.returncode
    # nothing of the run is left on the hosts
    wait_until("no process left on the hosts", lambda: not left(), 30)
