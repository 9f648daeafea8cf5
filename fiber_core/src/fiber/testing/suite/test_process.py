"""fiber.Process on the selected backend (``--backend``): the multiprocessing.Process
API, exit codes, output, termination."""

from __future__ import annotations

import multiprocessing.connection
import os
import sys
import time

import pytest

import fiber


def _exit_with(code):
    sys.exit(code)


def _raise():
    raise RuntimeError("boom in child")


def _sleep(seconds):
    time.sleep(seconds)


def _report(q):
    me = fiber.current_process()
    q.put((me.name, fiber.parent_process().name, os.getpid(), me.daemon))


class Square(fiber.Process):
    def __init__(self, q, x):
        super().__init__()
        self.q, self.x = q, x

    def run(self):
        self.q.put(self.x * self.x)


def test_exit_codes():
    ok = fiber.Process(target=_exit_with, args=(0,))
    bad = fiber.Process(target=_exit_with, args=(7,))
    err = fiber.Process(target=_raise)
    for p in (ok, bad, err):
        p.start()
    for p in (ok, bad, err):
        p.join(120)
    assert (ok.exitcode, bad.exitcode, err.exitcode) == (0, 7, 1)
    assert not ok.is_alive()


def test_lifecycle_attributes():
    p = fiber.Process(target=_sleep, args=(60,), name="sleeper", daemon=True)
    assert p.exitcode is None and not p.is_alive() and p.name == "sleeper" and p.daemon
    assert "initial" in repr(p)
    p.start()
    assert p.is_alive()
    assert p in fiber.active_children()
    assert isinstance(p.sentinel, int)
    ready = multiprocessing.connection.wait([p.sentinel], timeout=0.5)
    assert ready == []
    p.terminate()
    p.join(60)
    assert p.exitcode == -15
    assert multiprocessing.connection.wait([p.sentinel], timeout=5) == [p.sentinel]
    assert p not in fiber.active_children()
    p.close()
    with pytest.raises(ValueError):
        p.is_alive()


def test_kill_gives_minus_nine():
    p = fiber.Process(target=_sleep, args=(60,))
    p.start()
    time.sleep(0.5)
    p.kill()
    p.join(60)
    assert p.exitcode == -9


def test_kill_and_terminate_right_after_start_give_their_signal():
    """Ended before its job may have run (a batch job still pending is cancelled, and
    the scheduler reports its own signal): the exit code is still the one asked for,
    -9 for kill() and -15 for terminate(), as multiprocessing's."""
    for end, code in (("kill", -9), ("terminate", -15)):
        p = fiber.Process(target=_sleep, args=(60,))
        p.start()
        getattr(p, end)()
        p.join(60)
        assert p.exitcode == code, end


def test_join_timeout_returns():
    p = fiber.Process(target=_sleep, args=(60,))
    p.start()
    started = time.monotonic()
    p.join(0.3)
    assert time.monotonic() - started < 5
    assert p.exitcode is None
    p.terminate()
    p.join(60)


def test_child_sees_its_process_and_parent():
    q = fiber.Queue()
    p = fiber.Process(target=_report, args=(q,), name="reporter")
    p.start()
    name, parent, pid, daemon = q.get(timeout=120)
    p.join(60)
    assert (name, parent, daemon) == ("reporter", "MainProcess", False)
    assert pid == p.pid or p.pid is not None


def test_subclass_run_and_lambda_target():
    q = fiber.Queue()
    s = Square(q, 12)
    s.start()
    assert q.get(timeout=120) == 144
    s.join(60)
    captured = 5
    p = fiber.Process(target=lambda: q.put(captured + 1))  # a closure: cloudpickle
    p.start()
    assert q.get(timeout=120) == 6
    p.join(60)
    assert p.exitcode == 0


def test_cannot_start_twice_or_join_unstarted():
    p = fiber.Process(target=_exit_with, args=(0,))
    with pytest.raises(AssertionError):
        p.join()
    p.start()
    with pytest.raises(AssertionError):
        p.start()
    p.join(60)


def _send_own_pid(q):
    import os

    q.put(os.getpid())


def test_pid_after_start_is_the_process_id_of_the_job():
    """As in multiprocessing, a started process has its pid (fiber waits until the job
    runs when the backend does not name jobs by their pid): code that keys its
    processes by pid, as concurrent.futures.ProcessPoolExecutor does, works."""
    q = fiber.Queue()
    procs = [fiber.Process(target=_send_own_pid, args=(q,)) for _ in range(2)]
    for p in procs:
        p.start()
    pids = [p.pid for p in procs]
    assert all(isinstance(pid, int) for pid in pids)
    assert sorted(q.get(timeout=120) for _ in procs) == sorted(pids)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0 and p.pid in pids
