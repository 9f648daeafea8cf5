"""``fiber dashboard`` against a real running program: this test process holds a Pool
of local workers (so ``Pool.stats()`` can be compared with the page), and ``fiber
dashboard --pid <this process>`` runs as a subprocess, as a user would start it.

The security tests speak HTTP with urllib and raw sockets; the browser test drives
Debian's Chromium headless through Selenium and Debian's chromedriver (installed by
scripts/engines/chromium/install.sh when missing; the helpers are tests/dashboard_page.py,
shared with the ssh backend's test): the page loads with the token and is refused
without it, its counts match ``Pool.stats()``, a task that raises shows its
remote traceback within 2 s, a killed worker shows as lost and its replacement appears,
and the plot grows. It saves screenshots of each step in the test's temporary directory.
"""

from __future__ import annotations

import http.client
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

import fiber
from fiber.runtime import status


def nap(seconds):
    time.sleep(seconds)
    return seconds


def square(x):
    return x * x


def fail(x):
    raise KeyError(f"no such key {x}")


@pytest.fixture
def pool():
    with fiber.Pool(3) as p:
        yield p
        p.terminate()


@pytest.fixture
def dashboard(pool):
    d = Dashboard()
    yield d
    d.stop()
    assert d.proc.returncode == 0, d.proc.returncode


# -- security ---------------------------------------------------------------------------
HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer"}


def check_headers(headers) -> None:
    for name, value in HEADERS.items():
        assert headers.get(name) == value, (name, headers.get(name))
    csp = headers.get("Content-Security-Policy") or ""
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp
    assert headers.get("Access-Control-Allow-Origin") is None  # no CORS


def test_the_token_is_needed_and_the_headers_keep_other_sites_out(dashboard):
    d = dashboard
    token = d.token
    for path in ("/", "/dashboard.js", "/events", "/api/view", "/nosuch"):
        code, headers, body = d.get(path)  # no token
        assert code == 401, (path, code)
        check_headers(headers)
        for wrong in ("x", token[:-1] + ("A" if token[-1] != "A" else "B"), token + "x"):
            code, headers, body = d.get(f"{path}?token={wrong}")
            assert code == 403, (path, wrong, code)
            check_headers(headers)
    code, headers, body = d.get(f"/?token={token}")
    assert code == 200 and b"fiber dashboard" in body
    check_headers(headers)
    code, headers, body = d.get("/api/view", {"Authorization": f"token {token}"})
    assert code == 200 and b'"pools"' in body
    check_headers(headers)
    # another site a DNS name was pointed at: refused even with the token
    code, headers, body = d.get(f"/?token={token}", {"Host": f"evil.example:{d.port}"})
    assert code == 403 and b"Host" in body
    # nothing changes the program: no other method is served
    for method in ("POST", "PUT", "DELETE"):
        code, _, _ = d.get(f"/api/view?token={token}", method=method)
        assert code == 501, (method, code)
    # no secret of the run in anything served
    (program,) = [p for p in status.programs() if p.pid == os.getpid()]
    for path in ("/", "/dashboard.js", "/dashboard.css", "/api/view"):
        code, _, body = d.get(f"{path}?token={token}")
        assert code == 200 and program.authkey.encode() not in body, path


def test_a_workers_log_is_asked_for_by_pool_and_worker(dashboard, pool):
    import json

    pid = pool_id(pool)
    wait_until("a running worker", lambda: pool.stats().idle == 3, 60)
    worker = pool.stats().workers[0]
    token = dashboard.token
    code, _, body = dashboard.get(f"/api/log?token={token}&pool={pid}&worker={worker.id}")
    answer = json.loads(body)
    assert code == 200 and answer["job_id"] == worker.process.job_id
    assert answer["log"] == ""  # the local backend keeps no log (output goes to stdout)
    code, _, body = dashboard.get(f"/api/log?token={token}&pool={pid}&worker=9999")
    assert code == 200 and json.loads(body)["log"] is None  # no such worker
    code, _, _ = dashboard.get(f"/api/log?token={token}&pool=x&worker=1")
    assert code == 400
    code, _, _ = dashboard.get(f"/api/log?pool={pid}&worker={worker.id}")
    assert code == 401


def test_a_client_that_sends_nothing_or_too_much_is_dropped(dashboard):
    from fiber.dashboard import server

    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=30) as s:
        s.sendall(b"GET /?tok")  # and nothing more
        assert s.recv(100) == b""  # closed without an answer
    took = time.monotonic() - t0
    assert server.HEAD_SECONDS - 0.5 < took < server.HEAD_SECONDS + 3, took
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.0\r\n")
        try:
            for _ in range(40):
                s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
        except OSError:
            pass  # closed while we wrote
        data = s.recv(100)
        assert not data.startswith(b"HTTP/1.0 200"), data


def test_the_program_is_asked_only_while_a_page_is_open(dashboard, pool, monkeypatch):
    from fiber.dashboard import feed

    asked = []
    real = status.snapshot
    monkeypatch.setattr(status, "snapshot", lambda: asked.append(1) or real())
    time.sleep(3)
    assert asked == []  # no page: not asked
    conn = http.client.HTTPConnection("127.0.0.1", dashboard.port, timeout=15)
    conn.request("GET", f"/events?token={dashboard.token}")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
    events = 0
    while events < 3:
        line = resp.fp.readline()
        events += line.startswith(b"data: ")
    resp.close()  # (its file holds the socket open)
    conn.close()
    assert len(asked) >= 3
    time.sleep(feed.LINGER + 2)  # (the server sees the page gone at its next event)
    seen = len(asked)
    time.sleep(3)
    assert len(asked) == seen  # the page is gone: asked no more


# -- the page in a real browser ---------------------------------------------------------
@pytest.fixture
def browser(tmp_path):
    with chromium(tmp_path) as driver:
        yield driver


def test_the_page_in_a_browser(pool, dashboard, browser, tmp_path):
    d, driver = dashboard, browser
    pid = pool_id(pool)
    assert pool.map(square, range(20), chunksize=1) == [x * x for x in range(20)]
    naps = [pool.apply_async(nap, (120,)) for _ in range(2)]
    wait_until("two busy workers", lambda: pool.stats().busy == 2 and pool.stats().idle == 1, 60)

    # without the token: refused, and the browser shows why
    driver.get(d.base + "/")
    assert "needs its token" in driver.find_element("tag name", "body").text
    driver.get(d.base + "/?token=wrong")
    assert "wrong token" in driver.find_element("tag name", "body").text
    driver.save_screenshot(str(tmp_path / "0-refused.png"))

    driver.get(d.url)
    wait_until("the pool's card", lambda: text_of(driver, f"pool-{pid}-w-busy"), 15,
               driver, tmp_path / "fail-load.png")

    def counts_match():
        return page_counts(driver, pid) == stats_counts(pool.stats())

    wait_until("the counts of Pool.stats()", counts_match, 10, driver,
               tmp_path / "fail-counts.png")
    driver.save_screenshot(str(tmp_path / "1-loaded.png"))

    # the plot grows as the page stays open
    def points() -> int:
        return int(attribute_of(driver, f"pool-{pid}-plot", "data-points") or 0)
    first = points()
    wait_until("the plot's new points", lambda: points() >= first + 2, 10)

    # a task that raises: its remote traceback within 2 s
    started = time.monotonic()
    failing = pool.apply_async(fail, (7,))

    def traceback_shown() -> bool:
        text = text_of(driver, f"pool-{pid}-errors") or ""
        return "KeyError" in text and "Traceback" in text and "in fail" in text
    wait_until("the traceback", traceback_shown, 10, driver, tmp_path / "fail-error.png")
    took = time.monotonic() - started
    with pytest.raises(KeyError):
        failing.get(10)
    assert took <= 2.0, f"the traceback took {took:.2f} s to show"
    driver.save_screenshot(str(tmp_path / "2-error.png"))

    # a reader selecting the traceback keeps it: the page waits with its redraws
    driver.execute_script(
        "const r = document.createRange();"
        "r.selectNodeContents(document.querySelector(arguments[0]));"
        "getSelection().removeAllRanges(); getSelection().addRange(r);",
        f"#pool-{pid}-errors pre")
    held = driver.execute_script("return document.body.dataset.updated;")
    time.sleep(2.5)
    assert driver.execute_script("return document.body.dataset.updated;") == held
    assert "KeyError" in driver.execute_script("return getSelection().toString();")
    driver.execute_script("getSelection().removeAllRanges();")
    wait_until("the redraws again", lambda: driver.execute_script(
        "return document.body.dataset.updated;") != held, 5)

    # a worker's job log, asked for by its button (the local backend keeps none: a
    # job's output goes to the program's own stdout, and the panel says so)
    (busy, *_) = [w for w in pool.stats().workers if w.state == "busy"]
    assert driver.execute_script(
        "const b = document.querySelector(arguments[0]); if (b) b.click(); return !!b;",
        f"button[data-log='{pid}-{busy.id}']")

    def log_shown() -> str:
        text = text_of(driver, f"pool-{pid}-log") or ""
        return text if "keeps no log" in text else ""
    shown = wait_until("the log panel", log_shown, 10, driver, tmp_path / "fail-log.png")
    assert f"log of worker {busy.id} (job {busy.process.job_id})" in shown

    # a killed worker: lost, and its replacement appears
    (idle,) = [w for w in pool.stats().workers if w.state == "idle"]
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
    driver.save_screenshot(str(tmp_path / "3-lost.png"))
    assert not any(n.ready() for n in naps)
