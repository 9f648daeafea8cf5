"""The master's work per worker start and per line does not grow with the number of
workers, and its stream listener keeps reading heartbeats while the pool's lock is
held (issue #29: at thousands of simulated workers, starting was quadratic and jobs
were ended as "silent" while the listener waited for the pool's lock).

Real processes on the local backend. The counting tests wrap a method of fiber's own
classes to count its calls (the call still runs: nothing is faked).
"""

from __future__ import annotations

import logging
import os
import threading
import time

import fiber
from fiber import process as fiber_process
from fiber.runtime.popen import JobPopen


def test_start_does_not_poll_every_earlier_child(monkeypatch):
    """``Process.start`` forgets ended children without polling the live ones: with 6
    children running, a 7th start polls none of them (it polled all 6 before); a child
    that has ended is forgotten by the next start."""
    children = [fiber.Process(target=time.sleep, args=(60,), daemon=True) for _ in range(6)]
    for p in children:
        p.start()
    short = fiber.Process(target=time.sleep, args=(0,), daemon=True)
    short.start()
    deadline = time.monotonic() + 60
    while short.exitcode is None:
        assert time.monotonic() < deadline, "the short child did not end"
        time.sleep(0.05)
    polled = []
    main = threading.current_thread()
    real_poll = JobPopen.poll

    def counting_poll(self):
        if threading.current_thread() is main:
            polled.append(self)
        return real_poll(self)

    monkeypatch.setattr(JobPopen, "poll", counting_poll)
    last = fiber.Process(target=time.sleep, args=(60,), daemon=True)
    try:
        last.start()
        monkeypatch.setattr(JobPopen, "poll", real_poll)
        live_polled = [p for p in polled if p is not short._popen]
        assert live_polled == [], f"start polled {len(live_polled)} live children"
        assert short not in fiber_process._children  # the ended one is forgotten
        assert set(fiber.active_children()) == set(children) | {last}
    finally:
        monkeypatch.setattr(JobPopen, "poll", real_poll)
        for p in children + [last]:
            p.kill()
        for p in children + [last, short]:
            p.join(30)


def test_starting_a_pool_does_not_scan_its_workers_per_start(monkeypatch):
    """The starter threads of a Pool(10) do not look at every earlier worker's exit
    code on each start (they did: 0 + 1 + ... + 9 = 45 looks under the pool's lock)."""
    looks = []
    real = fiber.Process.exitcode

    def counting(self):
        if threading.current_thread().name.startswith("fiber-pool-start"):
            looks.append(self)
        return real.fget(self)

    monkeypatch.setattr(fiber.Process, "exitcode", property(counting))
    with fiber.Pool(10) as pool:
        assert pool.map(abs, range(-40, 0)) == list(range(40, 0, -1))
        deadline = time.monotonic() + 60
        while pool.stats().starting:  # every start has returned
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert len(looks) < 10, f"{len(looks)} looks at exit codes by the starters"


def test_heartbeats_are_read_while_the_pool_lock_is_held(caplog):
    """A pool worker's result arrives while another thread holds the pool's lock for
    twice the heartbeat timeout: the stream listener hands the result line over and
    goes on reading, so the worker's heartbeats keep it alive (before: the listener
    waited for the lock, read no heartbeat, and the job was ended as silent)."""
    ctx = fiber.get_context("local", heartbeat_timeout=3.0)
    with ctx.Pool(1) as pool:
        pid = pool.apply(os.getpid)
        result = pool.apply_async(time.sleep, (0.3,))
        with caplog.at_level(logging.WARNING, logger="fiber"):
            with pool._lock:
                time.sleep(7)
            assert result.get(30) is None
            assert pool.apply(os.getpid) == pid, "the worker was replaced"
        silent = [r.getMessage() for r in caplog.records if "silent" in r.getMessage()]
        assert silent == []


class _Echo:
    """A hub channel that answers each request with its payload."""

    def handle(self, request, payload) -> None:
        request.reply(bytes(payload))

    def peer_gone(self, peer: int) -> None:
        pass


def test_an_accepted_connection_holds_no_read_buffer_of_its_own():
    """100 real stream connections to a hub, each having sent a request and got its
    answer: what the listener's side allocated for them (tracemalloc, the lines of
    fiber/wire/stream/accepted.py) is under 4 KiB per connection (each had its own
    64 KiB read buffer before; the selector thread now reads into one of its own)."""
    import tracemalloc

    from fiber.wire import transport
    from fiber.wire.stream.client import StreamClient

    hub = transport.Hub("127.0.0.1")
    clients = []
    tracemalloc.start()
    try:
        cid = hub.add_channel(_Echo(), stream=True)
        before = tracemalloc.take_snapshot()
        for i in range(100):
            client = StreamClient(hub.stream_address)
            clients.append(client)
            assert client.request(cid, b"hello %d" % i) == b"hello %d" % i
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        for client in clients:
            client.close()
        hub.close()
    only = [tracemalloc.Filter(True, "*fiber/wire/stream/accepted.py")]
    grown = sum(stat.size_diff for stat in after.filter_traces(only).compare_to(
        before.filter_traces(only), "filename"))
    assert grown / 100 < 4096, f"{grown / 100:.0f} bytes per accepted connection"


def sleep_ms(ms):
    time.sleep(ms / 1000)
    return ms


def _busy_master(pool, stop):
    """Holds the pool's lock 20 ms of every 25: a master slow to read its workers'
    results, as one saturated by thousands of workers is."""
    while not stop.is_set():
        with pool._lock:
            time.sleep(0.02)
        time.sleep(0.005)


def test_short_tasks_are_batched_when_the_master_is_slow():
    """A map of 1 ms tasks while the master reads results late (its lock held 20 ms
    of every 25 by another thread): the pool's estimate of a task's time comes from the
    workers' own clocks, so the tasks still count as short (under LONG_TASK, batched).
    Before, it came from the intervals between results as the master read them (over
    20 ms here), the tasks counted as long and went one per batch. A map of 30 ms tasks
    still counts as long."""
    from fiber.runtime.pool.chunking import LONG_TASK

    with fiber.Pool(2) as pool:
        pool.map(abs, range(4))
        stop = threading.Event()
        slow = threading.Thread(target=_busy_master, args=(pool, stop))
        slow.start()
        try:
            assert pool.map(sleep_ms, [1] * 300, chunksize=1) == [1] * 300
            short = pool.stats().task_seconds
        finally:
            stop.set()
            slow.join()
        assert short is not None and short < LONG_TASK, short
        assert pool.map(sleep_ms, [30] * 24, chunksize=1) == [30] * 24
        long = pool.stats().task_seconds
        assert long is not None and long >= LONG_TASK, long


def test_heartbeats_and_polls_are_spaced_out_with_many_jobs(monkeypatch):
    """With more jobs than the parent answers heartbeats (or asks statuses) a second,
    it answers each job's heartbeat, and polls the backend, less often: here the
    budgets are set to 1 a second (fiber's knobs; real jobs, real backend), so 3 jobs
    beat every 2 s (a third of the 6 s timeout) instead of every 0.3 s, and the monitor
    polls every 3 s instead of every 0.2 s. Counted over 4 s: before, about 40 beats
    and 20 polls."""
    from fiber.backend.local.backend import LocalBackend
    from fiber.runtime import control, monitor

    monkeypatch.setattr(control, "BEATS_PER_SECOND", 1.0, raising=False)
    monkeypatch.setattr(monitor, "STATUSES_PER_SECOND", 1.0, raising=False)
    ctx = fiber.get_context("local", heartbeat_interval=0.3, heartbeat_timeout=6.0)
    procs = [ctx.Process(target=time.sleep, args=(60,), daemon=True) for _ in range(3)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            assert p.pid is not None  # connected (its heartbeat is under way)
        time.sleep(2.5)  # every job's beat and the monitor's pause are at the new pace
        beats, polls = [], []
        real_beat, real_poll = control.ControlChannel._beat, LocalBackend.poll

        def counting_beat(self, request):
            beats.append(self)
            return real_beat(self, request)

        def counting_poll(self, jobs):
            polls.append(len(jobs))
            return real_poll(self, jobs)

        monkeypatch.setattr(control.ControlChannel, "_beat", counting_beat)
        monkeypatch.setattr(LocalBackend, "poll", counting_poll)
        time.sleep(4)
        monkeypatch.setattr(control.ControlChannel, "_beat", real_beat)
        monkeypatch.setattr(LocalBackend, "poll", real_poll)
        assert len(beats) <= 9, f"{len(beats)} heartbeats answered in 4 s"
        assert len(polls) <= 3, f"{len(polls)} polls in 4 s"
        assert all(p.is_alive() for p in procs)  # none was taken for silent
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.join(30)


def test_the_monitor_polls_connected_jobs_a_slice_at_a_time(monkeypatch):
    """The job monitor asks the backend for the statuses of every job that has not
    connected (or whose connection dropped) but of at most ``QUIET_SLICE`` connected
    ones a poll, in turn: with the slice set to 2 and 6 children connected, starting a
    7th and the 3 s after, no poll asks for more than 2 of the 6, and all 6 are asked
    for in turn (before: every poll asked for all 7, and each start woke the monitor
    for one). A connected child killed from outside is polled at once when its
    connection drops: its end is reported and its job released. Real processes, real
    local backend; the backend's poll is wrapped to count (the call still runs)."""
    from fiber.backend.local.backend import LocalBackend
    from fiber.runtime import monitor

    monkeypatch.setattr(monitor, "QUIET_SLICE", 2, raising=False)

    children = [fiber.Process(target=time.sleep, args=(60,), daemon=True) for _ in range(6)]
    for p in children:
        p.start()
    last = fiber.Process(target=time.sleep, args=(60,), daemon=True)
    polled: list[set[str]] = []
    real_poll = LocalBackend.poll

    def counting_poll(self, jobs):
        polled.append({job.id for job in jobs})
        return real_poll(self, jobs)

    try:
        deadline = time.monotonic() + 60
        while not all(p._popen.is_connected for p in children):
            assert time.monotonic() < deadline, "the children did not connect"
            time.sleep(0.05)
        time.sleep(0.2)  # (a poll that began before the last hello has been asked)
        connected = {p._popen.job.id for p in children}
        monkeypatch.setattr(LocalBackend, "poll", counting_poll)
        last.start()
        assert last.pid is not None
        time.sleep(3)
        asked = [ids & connected for ids in polled]
        assert asked and all(len(ids) <= 2 for ids in asked), asked
        assert set().union(*asked) == connected, asked  # each in turn
        victim = children[0]
        os.kill(victim.pid, 9)
        victim.join(15)
        assert victim.exitcode == -9
        deadline = time.monotonic() + 15
        while not victim._popen._released:  # its final status came from a poll
            assert time.monotonic() < deadline, "the killed child's job was not released"
            time.sleep(0.05)
        assert any(victim._popen.job.id in ids for ids in polled)
    finally:
        monkeypatch.setattr(LocalBackend, "poll", real_poll)
        started = [p for p in children + [last] if p._popen is not None]
        for p in started:
            p.kill()
        for p in started:
            p.join(30)
