"""What the dashboard's tests share (tests/core, tests/ssh, tests/bench): ``fiber
dashboard`` run as a subprocess, as a user starts it, headless Chromium driven through
Selenium and Debian's chromedriver (scripts/engines/chromium/install.sh installs both
when missing), and reads of the page, each one script call (the page redraws every
second, so an element found by one call may be gone by the next)."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INSTALL = ROOT / "scripts" / "engines" / "chromium" / "install.sh"

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,2200"]


class Dashboard:
    """A ``fiber dashboard`` subprocess showing the program ``pid`` (default: this one)."""

    def __init__(self, pid: int | None = None, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fiber.cli", "dashboard", "--pid",
             str(os.getpid() if pid is None else pid), "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = ""
        deadline = time.monotonic() + 30
        while "token=" not in line:
            assert time.monotonic() < deadline, "fiber dashboard printed no URL"
            line = self.proc.stdout.readline()
            assert line or self.proc.poll() is None, self.proc.stderr.read()
        self.url = re.search(r"http://\S+", line).group(0)
        self.base, self.token = self.url.split("/?token=")
        self.port = int(self.base.rsplit(":", 1)[1])

    def get(self, path: str, headers: dict | None = None, method: str = "GET"):
        """(status, headers, body) of a request to ``path``."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.headers, resp.read()
        finally:
            conn.close()

    def stop(self) -> None:
        """Ctrl-C, as a user stops it (killed if it does not end within 15 s)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
            self.proc.stderr.close()


def processes_with(text: str) -> list[int]:
    """The pids of the processes whose command line holds ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@contextlib.contextmanager
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A Selenium driver of headless Chromium with a profile in ``tmp_path``; on exit
    the browser is quit and checked gone (no process of its profile left)."""
    subprocess.run(["sh", str(INSTALL)], check=True, stdin=subprocess.DEVNULL)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tmp_path / "chromium-profile"
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        deadline = time.monotonic() + 10
        while processes_with(str(profile)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with(str(profile)) == []  # the browser is gone
        shutil.rmtree(profile, ignore_errors=True)


def text_of(driver: Any, element_id: str) -> str | None:
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent : null;",
        element_id)


def attribute_of(driver: Any, element_id: str, name: str) -> str | None:
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]);"
        "return e ? e.getAttribute(arguments[1]) : null;", element_id, name)


def worker_ids(driver: Any, selector: str) -> set[int]:
    return set(driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(r => Number(r.dataset.worker));", selector))


COUNT_KEYS = ["w-processes", "w-pending", "w-starting", "w-running", "w-busy", "w-idle",
              "w-stopping", "w-lost", "w-replaced", "t-queued", "t-running", "t-done",
              "t-failed"]


def page_counts(driver: Any, pid: int) -> dict[str, str | None]:
    """The counts the page shows of pool ``pid`` (read in one script call)."""
    values = driver.execute_script(
        "return arguments[0].map(k => { const e = document.getElementById("
        f"'pool-{pid}-' + k); return e ? e.textContent : null; }});", COUNT_KEYS)
    return dict(zip(COUNT_KEYS, values, strict=True))


def stats_counts(s: Any) -> dict[str, str]:
    """The same counts of a :class:`fiber.PoolStats`."""
    return {"w-processes": str(s.processes), "w-pending": str(s.pending),
            "w-starting": str(s.starting - s.pending), "w-running": str(s.idle + s.busy),
            "w-busy": str(s.busy), "w-idle": str(s.idle), "w-stopping": str(s.stopping),
            "w-lost": str(s.lost), "w-replaced": str(s.replaced), "t-queued": str(s.queued),
            "t-running": str(s.running), "t-done": str(s.done), "t-failed": str(s.failed)}


def wait_until(what: str, check: Callable[[], Any], timeout: float, driver: Any = None,
               shot: Path | None = None) -> Any:
    """``check()``'s first true value within ``timeout`` seconds; else a screenshot to
    ``shot`` (with a ``driver``) and AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            if driver is not None and shot is not None:
                driver.save_screenshot(str(shot))
            raise AssertionError(f"{what} not seen within {timeout} s")
        time.sleep(0.1)


def pool_id(pool: Any) -> int:
    """The id under which this process's status channel shows ``pool``."""
    from fiber.runtime import status

    return next(k for k, v in list(status._pools.items()) if v is pool)
