"""``fiber dashboard`` in a real browser on a cluster backend: this test process holds a
Pool whose workers are jobs on the real SSH test hosts (h1 and h2, network namespaces
with their own sshd, started by the tests), and ``fiber dashboard --pid <this
process>`` runs as a subprocess, as a user starts it on the login node. Headless
Chromium (Selenium, Debian's chromedriver: tests/dashboard_page.py) checks that the
page's counts equal ``Pool.stats()``, a task that raises shows its remote traceback
within 2 s, a worker's job log (the output the ssh backend keeps of the job: here what
the worker wrote to its own stderr, which the backend reads from the job's channel)
shows in its panel, a worker whose process is killed on its host shows as lost (its
log still at hand) and its replacement appears, and the plot grows. Screenshots of each step are saved in the
test's temporary directory."""

from __future__ import annotations

import collections
import os
import signal
import socket
import time

import pytest
from dashboard_page import (
    Dashboard,
    attribute_of,
    chromium,
    page_counts,
    pool_id,
    stats_counts,
    text_of,
    wait_until,
    worker_ids,
)
from ssh_helpers import describe, fiber_jobs, hosts_script

import fiber


def mark() -> None:
    """A worker's initializer: one line on the job's own stderr (not sys.stderr, which a
    job forwards to its parent): it goes to the job's log."""
    os.write(2, f"dashboard-test: worker pid {os.getpid()} on {socket.gethostname()} "
                f"is up\n".encode())


def nap(seconds: float) -> str:
    time.sleep(seconds)
    return socket.gethostname()


def host_of(x: int) -> str:
    time.sleep(0.05)
    return socket.gethostname()


def fail(x: int) -> None:
    raise KeyError(f"no such key {x} on {socket.gethostname()}")


@pytest.fixture
def pool(ssh_fiber, ssh_hosts):
    p = fiber.Pool(3, initializer=mark)
    try:
        yield p
    finally:
        p.terminate()
        p.join()
    deadline = time.monotonic() + 20
    while fiber_jobs(ssh_hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not fiber_jobs(ssh_hosts), describe(fiber_jobs(ssh_hosts))


@pytest.fixture
def dashboard(pool):
    d = Dashboard()
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.proc.returncode


@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


def host_pids(ssh_hosts, host: str) -> set[int]:
    """The processes in the namespace of the test host named ``host``."""
    (namespace,) = [h["namespace"] for h in ssh_hosts["hosts"] if h["name"] == host]
    return set(hosts_script.pids_in_namespaces([namespace]))


def test_the_page_of_a_pool_on_the_ssh_hosts(pool, dashboard, browser, ssh_hosts, tmp_path):
    d, driver = dashboard, browser
    pid = pool_id(pool)
    hosts = set(pool.map(host_of, range(24), chunksize=1))
    assert hosts <= {"h1", "h2"} and hosts
    naps = [pool.apply_async(nap, (120,)) for _ in range(2)]
    wait_until("two busy workers", lambda: pool.stats().busy == 2 and pool.stats().idle == 1,
               60)

    driver.get(d.url)
    wait_until("the pool's card", lambda: text_of(driver, f"pool-{pid}-w-busy"), 15,
               driver, tmp_path / "fail-load.png")
    assert "backend ssh" in (text_of(driver, "program") or "")

    def counts_match():
        return page_counts(driver, pid) == stats_counts(pool.stats())

    wait_until("the counts of Pool.stats()", counts_match, 10, driver,
               tmp_path / "fail-counts.png")
    # the workers counted by host, as Pool.stats() has them
    by_host = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(r => [r.cells[0].textContent, Number(r.cells[1].textContent)]);",
        f"#pool-{pid}-by-host tbody tr")
    assert dict(by_host) == dict(collections.Counter(
        w.process.host for w in pool.stats().workers)), by_host
    driver.save_screenshot(str(tmp_path / "1-loaded.png"))

    # the plot grows as the page stays open
    def points() -> int:
        return int(attribute_of(driver, f"pool-{pid}-plot", "data-points") or 0)
    first = points()
    wait_until("the plot's new points", lambda: points() >= first + 2, 10)

    # a task that raises on a host: its remote traceback within 2 s
    started = time.monotonic()
    failing = pool.apply_async(fail, (7,))

    def traceback_shown() -> bool:
        text = text_of(driver, f"pool-{pid}-errors") or ""
        return "KeyError" in text and "Traceback" in text and "in fail" in text
    wait_until("the traceback", traceback_shown, 10, driver, tmp_path / "fail-error.png")
    took = time.monotonic() - started
    with pytest.raises(KeyError, match="no such key 7 on h"):
        failing.get(10)
    assert took <= 2.0, f"the traceback took {took:.2f} s to show"
    driver.save_screenshot(str(tmp_path / "2-error.png"))

    # a worker's job log: what the ssh backend kept of the job's output, which holds
    # the line its initializer wrote to the job's own stderr on its host
    (busy, *_) = [w for w in pool.stats().workers if w.state == "busy"]
    assert driver.execute_script(
        "const b = document.querySelector(arguments[0]); if (b) b.click(); return !!b;",
        f"button[data-log='{pid}-{busy.id}']")
    line = f"dashboard-test: worker pid {busy.process.pid} on {busy.process.host} is up"

    def log_shown() -> str:
        text = text_of(driver, f"pool-{pid}-log") or ""
        return text if line in text else ""
    shown = wait_until("the job's log", log_shown, 10, driver, tmp_path / "fail-log.png")
    assert f"log of worker {busy.id} (job {busy.process.job_id})" in shown, shown
    driver.save_screenshot(str(tmp_path / "3-log.png"))

    # a worker's process killed on its host: lost, and its replacement appears
    (idle,) = [w for w in pool.stats().workers if w.state == "idle"]
    assert idle.process.pid in host_pids(ssh_hosts, idle.process.host)
    before = {w.id for w in pool.stats().workers}
    os.kill(idle.process.pid, signal.SIGKILL)

    def lost_and_replaced() -> bool:
        lost = worker_ids(driver, f"#pool-{pid}-lost-table tr[data-worker]")
        ids = worker_ids(driver, f"#pool-{pid}-workers tr[data-worker]")
        return (lost == {idle.id} and text_of(driver, f"pool-{pid}-w-lost") == "1"
                and idle.id not in ids and bool(ids - before))
    wait_until("the lost worker and its replacement", lost_and_replaced, 30, driver,
               tmp_path / "fail-lost.png")
    wait_until("a running replacement", lambda: pool.stats().idle == 1, 60)
    wait_until("the counts of Pool.stats() after the loss", counts_match, 10, driver,
               tmp_path / "fail-counts2.png")
    # the lost worker's job log is still there, by its button in the lost workers' list
    assert driver.execute_script(
        "const b = document.querySelector(arguments[0]); if (b) b.click(); return !!b;",
        f"#pool-{pid}-lost-table button[data-log='{pid}-{idle.id}']")
    line = f"dashboard-test: worker pid {idle.process.pid} on {idle.process.host} is up"

    def lost_log_shown() -> str:
        text = text_of(driver, f"pool-{pid}-log") or ""
        return text if line in text else ""
    shown = wait_until("the lost worker's log", lost_log_shown, 10, driver,
                       tmp_path / "fail-lost-log.png")
    assert f"log of worker {idle.id} (job {idle.process.job_id})" in shown, shown
    driver.save_screenshot(str(tmp_path / "4-lost.png"))
    assert not any(n.ready() for n in naps)
