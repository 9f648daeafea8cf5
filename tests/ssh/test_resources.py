"""Resources on the real SSH test hosts: a Process's cpu/memory request becomes its
host slots and memory in the backend's placement, and what SSH hosts cannot honour (a
GPU, a walltime, an unknown extra) is refused before any job starts."""

from __future__ import annotations

import time

import pytest

import fiber
from fiber.backend import ConfigError
from fiber.runtime import run


def _hold(seconds):
    time.sleep(seconds)


@pytest.mark.usefixtures("ssh_hosts")
def test_process_resources_take_host_slots():
    p = fiber.Process(target=_hold, args=(60,), resources={"cpu": 2, "memory": 64})
    p.start()
    try:
        # private read: the slots and memory the backend's placement counts (no API shows them)
        hosts = run.backend()._placement.hosts  # the default target's: p's
        used = [(h.used_slots, h.used_memory) for h in hosts if h.used_slots]
        assert used == [(2, 64)], run.backend()._placement.describe()
    finally:
        p.terminate()
        p.join(60)


@pytest.mark.usefixtures("ssh_hosts")
def test_what_ssh_cannot_honour_is_refused_before_any_job():
    for request, message in (({"gpu": 1}, "ssh backend cannot honour a gpu"),
                             ({"walltime": 60}, "ssh backend cannot honour a walltime"),
                             ({"extra": {"ssh": {"host": "h1"}}},
                              r"extra\['ssh'\]\['host'\]")):
        with pytest.raises(ConfigError, match=message):
            fiber.Pool(2, resources=request)
        p = fiber.Process(target=_hold, args=(1,), resources=request)
        with pytest.raises(ConfigError, match=message):
            p.start()
        assert p.job_id is None
