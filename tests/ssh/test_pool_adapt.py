"""An adaptive pool over two placements, the local backend first (up to 2 workers),
then the real SSH test hosts h1 and h2 (up to 3 workers: each a job over SSH), issue
#28: a burst runs on both, every task once, and after the idle timeout both are back at
zero with no job process left on the hosts. The time from the map to the first task
that began on a test host is printed (bench/results/adapt/first-task.md). Nothing is
faked."""

from __future__ import annotations

import socket
import time

import pytest
from ssh_helpers import describe, fiber_jobs

import fiber

pytestmark = pytest.mark.timeout(300)


def where(i: int) -> tuple[int, float, str]:
    """The task's number, when it began, and its host's name (h1, h2: the test hosts)."""
    began = time.time()
    time.sleep(0.5)
    return i, began, socket.gethostname()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.2)


def held(pool) -> list[int]:
    return [p.busy + p.idle + p.starting + p.pending
            for p in pool.stats().adapt.placements]


def test_a_burst_goes_from_local_to_ssh_and_back(ssh_fiber, ssh_hosts):
    """local max 2, then ssh max 3: the map runs on both, each task once; the pool never
    holds more than each placement's maximum; after the idle timeout both are at zero,
    no job process is left on the hosts, and the next map runs correctly."""
    local, ssh = fiber.get_context("local"), fiber.get_context("ssh")
    pool = fiber.Pool(1, context=local)
    n = 80
    try:
        pool.adapt(0, placements=[(local, 2), (ssh, 3)], idle_timeout=2.0)
        started = time.time()
        result = pool.map_async(where, range(n), chunksize=1)
        most = [0, 0]
        while not result.ready():
            counts = held(pool)
            most = [max(m, c) for m, c in zip(most, counts, strict=True)]
            time.sleep(0.1)
        out = result.get()
        took = time.time() - started
        assert [i for i, _, _ in out] == list(range(n))
        assert most[0] <= 2 and most[1] <= 3, most
        remote = [began for _, began, host in out if host in ("h1", "h2")]
        on_local = [began for _, began, host in out if host not in ("h1", "h2")]
        assert remote and on_local, (len(remote), len(on_local))
        first = min(remote) - started
        print(f"adaptive pool local 2 + ssh 3, {n} tasks of 0.5 s: {took:.1f} s; "
              f"{len(remote)} on the test hosts; first task on a host {first:.2f} s "
              "after the map")
        wait_for(lambda: held(pool) == [0, 0], 60, "both placements at zero")
        wait_for(lambda: not fiber_jobs(ssh_hosts), 60, "no job left on the hosts")
        assert pool.map(abs, range(-3, 3)) == [3, 2, 1, 0, 1, 2]
    finally:
        pool.terminate()
        pool.join()
    wait_for(lambda: not fiber_jobs(ssh_hosts), 60, "no job left on the hosts")
    assert not fiber_jobs(ssh_hosts), describe(fiber_jobs(ssh_hosts))
