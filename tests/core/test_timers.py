"""The hub's deadline thread (fiber.wire.timers) takes any deadline a peer's request can
carry: one far in the future (a timeout of 1e300 seconds, found by
tests/core/test_fuzz_decoders.py, killed the thread with OverflowError, and its death
then ran every pending timeout at once), infinity, or NaN. Real thread, real clock."""

from __future__ import annotations

import math
import threading
import time

import pytest

from fiber import threads
from fiber.wire.timers import Timers


@pytest.mark.parametrize("far", [1e300, math.inf, math.nan])
def test_a_far_deadline_waits_and_the_thread_lives(far):
    timers = Timers()
    ran: list[str] = []
    soon = threading.Event()
    before = len(threads.deaths())
    try:
        timers.call_later(far, lambda: ran.append("far"))
        timers.call_later(0.05, soon.set)
        assert soon.wait(5), "a near deadline was not run"
        time.sleep(0.2)
        assert ran == []  # the far one waits
        assert len(threads.deaths()) == before, threads.deaths()[before:]
        timers.call_later(0.05, lambda: ran.append("near"))
        time.sleep(0.5)
        assert ran == ["near"]
    finally:
        timers.close()
