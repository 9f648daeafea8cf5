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
from adapt_burst import burst_and_back
from ssh_helpers import describe, fiber_jobs

pytestmark = pytest.mark.timeout(300)


def where(i: int) -> tuple[int, float, str]:
    """The task's number, when it began, and its host's name (h1, h2: the test hosts)."""
    began = time.time()
    time.sleep(0.5)
    return i, began, socket.gethostname()


def test_a_burst_goes_from_local_to_ssh_and_back(ssh_fiber, ssh_hosts):
    """local max 2, then ssh max 3: the map runs on both, each task once; the pool never
    holds more than each placement's maximum; after the idle timeout both are at zero,
    no job process is left on the hosts, and the next map runs correctly
    (adapt_burst.burst_and_back)."""
    burst_and_back("ssh", 3, where, lambda host: host in ("h1", "h2"),
                   lambda: fiber_jobs(ssh_hosts), "no job left on the hosts", final_timeout=60)
    assert not fiber_jobs(ssh_hosts), describe(fiber_jobs(ssh_hosts))
