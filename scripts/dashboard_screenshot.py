"""Take docs/images/fiber-dashboard.png, the dashboard page's screenshot: a real
program (a Pool of 4 local workers running a map of slow tasks, one of which fails, and
a worker killed so that it is lost and replaced) is started, ``fiber dashboard`` serves
its page, and Debian's Chromium, headless through Selenium and Debian's chromedriver,
takes the picture once the page has a minute of history.

``.tox/core/bin/python scripts/dashboard_screenshot.py`` (the core tox env has
Selenium; scripts/engines/chromium/install.sh installs Chromium when missing, as the
browser test does). Everything it starts is ended before it returns."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "images" / "fiber-dashboard.png"
HISTORY = 45  # seconds of plot before the picture

PROGRAM = textwrap.dedent("""
    import random
    import time
    import fiber

    def simulate(x):
        time.sleep(random.choice([0.05, 0.1, 0.1, 0.2, 0.2, 0.4, 0.8]))
        if x == 150:
            raise ValueError(f"episode {x} diverged")
        return x

    if __name__ == "__main__":
        try:
            with fiber.Pool(4) as pool:
                for round in range(100):
                    pool.map_async(simulate, range(300), chunksize=1).wait()
        except KeyboardInterrupt:  # the script is done with it
            pass
""")


def main() -> int:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from fiber.runtime import status

    subprocess.run(["sh", str(ROOT / "scripts" / "engines" / "chromium" / "install.sh")],
                   check=True, stdin=subprocess.DEVNULL)
    profile = tempfile.mkdtemp(prefix="fiber-dashboard-shot-")
    script = Path(profile) / "es_run.py"
    script.write_text(PROGRAM)
    prog = subprocess.Popen([sys.executable, str(script)], cwd=profile)
    dash = None
    driver = None
    try:
        deadline = time.monotonic() + 60
        while not any(p.pid == prog.pid for p in status.programs()):
            if time.monotonic() > deadline:
                raise SystemExit("the program did not register a pool within 60 s")
            time.sleep(0.5)
        dash = subprocess.Popen([sys.executable, "-m", "fiber.cli", "dashboard", "--pid",
                                 str(prog.pid), "--port", "0"], stdout=subprocess.PIPE,
                                text=True)
        assert dash.stdout is not None
        url = ""
        while not url:
            line = dash.stdout.readline()
            if not line:
                raise SystemExit("fiber dashboard printed no URL")
            found = re.search(r"http://\S+", line)
            url = found.group(0) if found else ""
        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                     "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync",
                     "--disable-dev-shm-usage", "--window-size=1280,1500",
                     f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.get(url)
        time.sleep(HISTORY / 2)
        snap = status.query(next(p for p in status.programs() if p.pid == prog.pid))
        idle = [w for w in snap["pools"][0]["worker_list"] if w["pid"]]
        os.kill(idle[-1]["pid"], signal.SIGKILL)  # lost, and replaced
        time.sleep(HISTORY / 2)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(OUT))
    finally:
        if driver is not None:
            driver.quit()
        for proc in (dash, prog):  # Ctrl-C: the program's Pool ends its workers
            if proc is not None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        subprocess.run(["rm", "-rf", profile], check=False)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
