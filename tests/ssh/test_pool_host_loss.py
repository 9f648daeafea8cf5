"""fiber.Pool on the ssh backend when one worker host is cut off mid-map: the real
test host h2 loses its link and every process on it is killed; its workers' jobs become
LOST, the pool replaces them on h1, and no task is lost (results equal the serial
result)."""

from __future__ import annotations

import socket
import time

from ssh_helpers import describe, fiber_jobs, kill_host_processes, set_link

import fiber


def slow_square(x: int) -> tuple[int, str]:
    time.sleep(0.05)
    return x * x, socket.gethostname()


def hostname(_: int) -> str:
    time.sleep(0.2)
    return socket.gethostname()


def test_pool_survives_a_host_cut_off_mid_map(ssh_fiber, ssh_hosts):
    items = list(range(240))
    serial = [x * x for x in items]
    pool = fiber.Pool(4)
    try:
        # every worker is up and the four are spread over both hosts
        assert set(pool.map(hostname, range(16), chunksize=1)) == {"h1", "h2"}
        results = []
        hosts_seen = set()
        cut = False
        for value, host in pool.imap(slow_square, items, chunksize=1):
            results.append(value)
            hosts_seen.add(host)
            if len(results) == 40 and not cut:
                set_link(ssh_hosts, 1, up=False)
                kill_host_processes(ssh_hosts, 1)
                cut = True
        assert cut
        assert results == serial
        assert pool.map(hostname, range(8)) == ["h1"] * 8  # h2 is gone for this backend
    finally:
        pool.terminate()
        pool.join()
        set_link(ssh_hosts, 1, up=True)
        kill_host_processes(ssh_hosts, 1)
    deadline = time.monotonic() + 20
    while fiber_jobs(ssh_hosts) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not fiber_jobs(ssh_hosts), describe(fiber_jobs(ssh_hosts))
