"""Faults cost time, never results: killed workers, a killed template process, a
cluster manager that fails for a while, leftovers of killed processes; and a clean run
logs nothing.

Tests marked "faulty" use the test plugin of ``tests/fault_plugin`` (found through its
entry point by putting the directory on ``PYTHONPATH``): the failures are injected in
front of the real local backend, which creates real jobs once the fault is over.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fault_map
import pytest

import fiber
from fiber.wire import shm

FAULT_PLUGIN = Path(__file__).parent.parent / "fault_plugin"


def faulty_env(**variables: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(FAULT_PLUGIN), os.environ.get("PYTHONPATH"))
                           if p)
    return {"PYTHONPATH": path, "FIBER_BACKEND": "faulty", **variables}


# -- killed workers ---------------------------------------------------------------------
def test_killed_fresh_workers_are_replaced(run_script):
    """Real SIGKILLs of workers that have not connected yet (each worker takes 0.5 s to
    import the main module, and is killed meanwhile), far more than the start failures
    that break a pool: the map still completes."""
    result = run_script(
        """
        import os, signal, threading, time
        import fiber

        if __name__ != "__main__":
            time.sleep(0.5)  # a worker importing the main module: still starting

        def square(x):
            time.sleep(0.02)
            return x * x

        if __name__ == "__main__":
            with fiber.Pool(2) as pool:
                killed = []

                def killer():
                    while len(killed) < 8 and not result.ready():
                        for w in pool.stats().workers:
                            p = w.process
                            if (len(killed) < 8 and w.state == "starting" and p is not None
                                    and p.pid and p.pid not in killed):
                                os.kill(p.pid, signal.SIGKILL)
                                killed.append(p.pid)
                        time.sleep(0.02)

                result = pool.map_async(square, range(100), chunksize=1)
                t = threading.Thread(target=killer)
                t.start()
                t.join(120)
                assert result.get(120) == [x * x for x in range(100)]
                stats = pool.stats()
                print("killed", len(killed), "lost", stats.lost, "replaced", stats.replaced)
        """, timeout=180)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[:2] == ["killed", "8"], result.stdout
    assert int(words[3]) >= 8 and int(words[5]) >= 8, result.stdout
    assert "in a row exited" not in result.stderr


def test_worker_failing_on_import_still_breaks_the_pool(run_script):
    """Workers that fail on their own (an exception importing the main module) break
    the pool after START_FAILURES_LIMIT of them, with their own traceback."""
    result = run_script(
        """
        import fiber
        from fiber.errors import ProcessStartError

        if __name__ != "__main__":
            raise RuntimeError("this worker cannot import its main module")

        if __name__ == "__main__":
            pool = fiber.Pool(2)
            try:
                pool.map(abs, range(10))
            except ProcessStartError as exc:
                print("broken:", exc)
                print("logs:", exc.logs)
            pool.terminate()
        """, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "broken:" in result.stdout, result.stdout + result.stderr
    assert "this worker cannot import its main module" in result.stdout
    # the workers' own traceback: in the error's logs, and printed once by the parent
    assert "Traceback" in result.stdout.split("logs:", 1)[1]
    assert result.stderr.count("Traceback") == 1, result.stderr


def test_worker_crashing_on_import_breaks_the_pool(run_script):
    """Workers that crash on their own while importing the main module (a real
    SIGABRT: a signal of their own making, not one sent from outside) count as failing
    on their own: the pool breaks after START_FAILURES_LIMIT of them, saying how they
    ended, instead of replacing them for ever."""
    result = run_script(
        """
        import os, time
        import fiber
        from fiber.errors import ProcessStartError

        if __name__ != "__main__":
            os.abort()  # a crash while importing the main module

        if __name__ == "__main__":
            pool = fiber.Pool(2)
            started = time.monotonic()
            try:
                pool.map(abs, range(10))
            except ProcessStartError as exc:
                print("broken after %.0f s:" % (time.monotonic() - started),
                      str(exc).replace("\\n", " "))
            pool.terminate()
        """, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "broken after" in result.stdout, result.stdout + result.stderr
    print(result.stdout)
    seconds = float(result.stdout.split()[2])
    assert seconds < 30, result.stdout
    assert "exit code -6" in result.stdout or "SIGABRT" in result.stdout, result.stdout
    assert "ended from outside" not in result.stdout, result.stdout


def test_manager_server_killed_from_outside_fails_its_proxies_promptly(run_script):
    """A real SIGKILL (sent from outside, by pid) of a ``fiber.Manager()``'s server:
    a call in flight and every later call of its proxies raise a clear error within
    seconds, nothing hangs, and the program exits promptly."""
    result = run_script(
        """
        import os, signal, threading, time
        import fiber

        if __name__ == "__main__":
            manager = fiber.Manager()
            shared = manager.list([1, 2, 3])
            event = manager.Event()
            assert shared[1] == 2
            outcome = []

            def waiter():
                try:
                    event.wait(120)  # in flight when the server dies
                    outcome.append("returned")
                except Exception as exc:
                    outcome.append(f"{type(exc).__name__}: {exc}")

            thread = threading.Thread(target=waiter)
            thread.start()
            time.sleep(0.5)
            os.kill(manager.process.pid, signal.SIGKILL)
            started = time.monotonic()
            thread.join(60)
            try:
                shared.append(4)
                later = "returned"
            except Exception as exc:
                later = f"{type(exc).__name__}: {exc}"
            print("seconds %.1f" % (time.monotonic() - started))
            print("in flight:", outcome)
            print("later:", later)
        """, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    print(result.stdout)
    assert float(lines[0].split()[1]) < 10, result.stdout
    for line in lines[1:]:
        assert "ConnectionLostError" in line and "manager" in line, result.stdout
        assert "returned" not in line


def test_pool_survives_its_template_being_killed(run_script):
    """A real SIGKILL of the local backend's template process in the middle of a map:
    its jobs end, a new template starts the replacements, the map completes."""
    result = run_script(
        """
        import os, signal, time
        import fiber

        def templates():
            found = []
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                    with open(f"/proc/{pid}/stat", "rb") as f:
                        ppid = int(f.read().rpartition(b")")[2].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == os.getpid() and b"fiber.backend.local.forkserver" in cmd:
                    found.append(int(pid))
            return found

        def slow(x):
            time.sleep(0.02)
            return -x

        if __name__ == "__main__":
            with fiber.Pool(3) as pool:
                result = pool.map_async(slow, range(300), chunksize=1)
                while pool.stats().done < 30:
                    time.sleep(0.01)
                (first,) = templates()
                os.kill(first, signal.SIGKILL)
                assert result.get(120) == [-x for x in range(300)]
                second = templates()
                print("replaced", pool.stats().replaced, "new template",
                      second != [] and first not in second)
        """, timeout=180)
    assert result.returncode == 0, result.stderr
    words = result.stdout.split()
    assert words[0] == "replaced" and int(words[1]) >= 3, result.stdout + result.stderr
    assert words[-1] == "True", result.stdout
    assert "template process (pid" in result.stderr  # said once, as a warning


def _templates() -> list[int]:
    """Pids of this process's local-backend template processes (its fork servers)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_bytes().rpartition(b")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"fiber.backend.local.forkserver" in cmd:
            found.append(int(entry))
    return found


@pytest.mark.slow
def test_long_map_survives_killed_workers_and_templates(tmp_path):
    """The local backend's fault test (#17), the counterpart of the engines' (see
    tests/fault_map.py): Pool(4) maps 5,000 tasks of 20 ms while 12 real SIGKILLs hit,
    one every 0.6 s, a random busy worker (two kills in three) or the template process
    (every third: all the workers forked from it end with it), and the template is
    frozen (SIGSTOP) for 5 s from about 4 s, once the pool is whole again (no kill from
    2 s until then; only workers are killed during the freeze), so the workers killed
    meanwhile are replaced only once it is thawed. Every result arrives once and right,
    every task ran,
    duplicate executions stay within one per killed worker (a template kill kills
    every worker), and no /dev/shm name of the dead processes is left."""
    log = str(tmp_path / "executions")
    n, size = 5000, 4
    shm_before = fault_map.shm_names()
    frozen: list[int] = []
    thawed: list[float] = []
    template_kills: list[int] = []

    with fiber.Pool(size) as pool:
        pool.map(abs, range(8))  # the workers (and the template) are up
        started = time.monotonic()

        def victims(killed: list[int]) -> list[int]:
            if not frozen and not thawed and time.monotonic() - started > 2.0:
                return []  # a quiet time before the freeze: the pool is whole then
            if len(killed) % 3 == 2 and not frozen:
                found = [pid for pid in _templates() if pid not in killed]
                template_kills.extend(found[:1])
                return found[:1]
            return fault_map.busy_workers(pool, killed)

        def freeze() -> None:
            deadline = time.monotonic() + 60
            while (len(fault_map.busy_workers(pool)) < size - 1
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            frozen[:] = _templates()
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)

        def thaw() -> None:
            for pid in frozen:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            frozen.clear()
            thawed.append(time.monotonic())

        result, faults = fault_map.map_under_faults(
            pool, functools.partial(fault_map.record, log), n, victims=victims,
            kills=12, every=0.6, seed=31, freeze=freeze, thaw=thaw, outage_after=4.0,
            outage_seconds=5.0)
        stats = pool.stats()
        assert pool.map(abs, range(-8, 0)) == list(range(8, 0, -1))  # still whole
    runs = fault_map.executions_in(log)
    templates_killed = [pid for pid in faults.kills if pid in template_kills]
    assert templates_killed, faults.kills
    duplicates = fault_map.check_exactly_once(
        result, n, runs, faults, extra_duplicates=len(templates_killed) * (size - 1))
    assert stats.lost >= len(faults.kills)
    print(f"{n} tasks, {len(faults.kills)} kills ({len(templates_killed)} of the "
          f"template, {len(faults.killed_in_outage)} during a 5 s template freeze): "
          f"{faults.seconds:.1f} s, "
          f"{duplicates} duplicate executions, {stats.lost} workers lost")
    assert not fault_map.dead_segments(shm_before)


def test_pool_rides_out_a_template_frozen_past_its_answer_time(run_script):
    """The template is frozen (a real SIGSTOP) for 6 s, three times its answer time
    (SPAWN_TIMEOUT, lowered to 2 s here), while a worker is SIGKILLed: its
    replacement's start is retried (a transient error, not a broken pool) until the
    template is thawed; the map completes, and the children the template forked for
    the starts given up on are ended (no job process is left after the pool)."""
    result = run_script(
        """
        import os, signal, time
        import fiber
        from fiber.backend.local import backend as local

        def templates():
            found = []
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmd = f.read()
                    with open(f"/proc/{pid}/stat", "rb") as f:
                        ppid = int(f.read().rpartition(b")")[2].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == os.getpid() and b"fiber.backend.local.forkserver" in cmd:
                    found.append(int(pid))
            return found

        def children_of(pid):
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    return [int(p) for p in f.read().split()]
            except OSError:
                return []

        def slow(x):
            time.sleep(0.02)
            return -x

        if __name__ == "__main__":
            local.SPAWN_TIMEOUT = 2.0
            with fiber.Pool(3) as pool:
                result = pool.map_async(slow, range(3000), chunksize=1)
                busy = []
                deadline = time.monotonic() + 60
                while not busy and time.monotonic() < deadline:
                    time.sleep(0.05)
                    busy = [w.process.pid for w in pool.stats().workers
                            if w.state == "busy" and w.process is not None
                            and w.process.pid]
                (template,) = templates()
                os.kill(template, signal.SIGSTOP)
                try:
                    os.kill(busy[0], signal.SIGKILL)
                    time.sleep(6)
                finally:
                    os.kill(template, signal.SIGCONT)
                assert result.get(120) == [-x for x in range(3000)]
                stats = pool.stats()
                print("replaced", stats.replaced, "processes", stats.processes)
            deadline = time.monotonic() + 10
            while children_of(template) and time.monotonic() < deadline:
                time.sleep(0.1)
            print("left", children_of(template))
        """, timeout=180)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    words = lines[0].split()
    assert words[0] == "replaced" and int(words[1]) >= 1, result.stdout + result.stderr
    assert lines[-1] == "left []", result.stdout
    print(result.stderr)
    assert "has not answered for 2 s" in result.stderr, result.stderr


# -- transient and permanent errors of the cluster manager ------------------------------
POOL_SCRIPT = """
    import time
    import fiber

    def square(x):
        return x * x

    if __name__ == "__main__":
        fiber.log_to_stderr()
        start = time.monotonic()
        pool = fiber.Pool(2)
        try:
            print("result", pool.map(square, range(20)) == [x * x for x in range(20)],
                  "workers", pool.stats().processes)
        except Exception as exc:
            print("failed", type(exc).__name__, str(exc).replace("\\n", " "),
                  getattr(exc, "__notes__", []))
        finally:
            pool.terminate()
        print("seconds %.1f" % (time.monotonic() - start))
"""


def test_transient_create_errors_are_retried(run_script):
    """faulty: the first 5 job creations fail with TransientBackendError."""
    result = run_script(POOL_SCRIPT, env=faulty_env(FAULTY_CREATE_TRANSIENT="5"))
    assert result.returncode == 0, result.stderr
    assert "result True workers 2" in result.stdout, result.stdout + result.stderr
    # one warning for the episode, naming what is retried and why
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1, result.stderr
    assert "failed to create a job" in warnings[0] and "503" in warnings[0]
    assert "retrying for up to 180 s" in warnings[0]


def test_permanent_create_error_fails_fast(run_script):
    """faulty: every job creation fails with JobCreationError: no retry."""
    result = run_script(POOL_SCRIPT, env=faulty_env(FAULTY_CREATE_PERMANENT="1"))
    assert result.returncode == 0, result.stderr
    assert "failed JobCreationError injected: the cluster refused the job" in result.stdout
    assert float(result.stdout.split("seconds")[1]) < 10, result.stdout
    assert "retrying" not in result.stderr


def test_unreachable_for_a_setting_fails_fast(run_script):
    """faulty: the cluster cannot be reached because of a setting
    (ClusterUnreachableError(transient=False)): no retry can mend it, none is made."""
    result = run_script(POOL_SCRIPT, env=faulty_env(FAULTY_CREATE_MISCONFIGURED="1"))
    assert result.returncode == 0, result.stderr
    assert "failed ClusterUnreachableError injected: the key file" in result.stdout, \
        result.stdout + result.stderr
    assert float(result.stdout.split("seconds")[1]) < 10, result.stdout
    assert "retrying" not in result.stderr


def test_transient_errors_past_the_budget_break_the_pool(run_script):
    """faulty: job creation fails transiently for good; backend_retry_timeout=2."""
    result = run_script(POOL_SCRIPT, env=faulty_env(FAULTY_CREATE_TRANSIENT="100000",
                                                    FIBER_BACKEND_RETRY_TIMEOUT="2"))
    assert result.returncode == 0, result.stderr
    assert "failed TransientBackendError injected: the API server answered 503" \
        in result.stdout, result.stdout + result.stderr
    if sys.version_info >= (3, 11):  # (exception notes)
        assert "backend_retry_timeout setting" in result.stdout  # the note says why
    seconds = float(result.stdout.split("seconds")[1])
    assert 2 <= seconds < 30, result.stdout


def test_terminate_stops_retrying_starts(run_script):
    """faulty: job creation fails transiently for good (budget 600 s); terminate()
    does not wait for the retries."""
    result = run_script(
        """
        import time
        import fiber

        if __name__ == "__main__":
            pool = fiber.Pool(2)
            pending = pool.apply_async(abs, (-1,))
            time.sleep(1.5)
            start = time.monotonic()
            pool.terminate()
            pool.join()
            try:
                pending.get(5)
            except ValueError as exc:
                print("pending failed:", exc)
            print("terminate took %.1f" % (time.monotonic() - start))
        """, env=faulty_env(FAULTY_CREATE_TRANSIENT="100000",
                            FIBER_BACKEND_RETRY_TIMEOUT="600"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pending failed: the pool was terminated" in result.stdout, result.stdout
    assert float(result.stdout.split("took")[1]) < 5, result.stdout


# -- status polling --------------------------------------------------------------------
def test_status_polling_rides_out_an_outage(monkeypatch, caplog):
    """faulty: the backend's poll fails for 2 s (in this process, with the plugin's
    backend class imported directly); the job, a real subprocess that ends at once, is
    reported once the outage is over, and the outage is logged once."""
    monkeypatch.syspath_prepend(str(FAULT_PLUGIN))
    monkeypatch.setenv("FAULTY_POLL_OUTAGE", "2")
    import fiber_faulty

    from fiber.backend.job import JobSpec
    from fiber.runtime.monitor import JobMonitor

    backend = fiber_faulty.FaultyBackend({"local_start_method": "spawn"})
    caplog.set_level(logging.DEBUG, logger="fiber")
    try:
        job = backend.create_job(JobSpec(command=[sys.executable, "-c", "pass"],
                                         name="outage"))
        ended: list = []
        done = threading.Event()
        start = time.monotonic()

        def on_end(status):
            ended.append((status, time.monotonic() - start))
            done.set()

        JobMonitor(backend).watch(job, on_end)
        assert done.wait(30)
        status, when = ended[0]
        assert status.state.value == "succeeded" and status.exitcode == 0
        assert when >= 1.9  # not before the outage ended
        assert fiber_faulty.injected_poll_failures >= 3
    finally:
        backend.close()
    records = [r for r in caplog.records if r.name == "fiber"]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot read the status" in warnings[0].getMessage()
    assert "injected: cannot reach" in warnings[0].getMessage()
    assert warnings[0].exc_info is None
    assert [r for r in records if r.levelno == logging.INFO
            and "can be read again" in r.getMessage()]
    assert not [r for r in records if r.levelno >= logging.INFO and r.exc_info]


# -- leftovers --------------------------------------------------------------------------
def test_new_program_sweeps_segments_of_dead_processes(run_script):
    """A segment named as shm names them, for a pid that has exited, is removed when a
    new program creates its hub; one of a live process stays."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pidns = shm.pidns()
    dead = f"fiber-{pidns}-{gone.pid}-{gone.pid}-{secrets.token_hex(8)}"
    live = f"fiber-{pidns}-{os.getpid()}-{os.getpid()}-{secrets.token_hex(8)}"
    for name in (dead, live):
        with open(os.path.join(shm.DIRECTORY, name), "wb") as f:
            f.write(bytes(shm.HEADER) + b"x" * 100)  # a one-off message
    try:
        assert dead in shm.segments(gone.pid)
        result = run_script(
            """
            import fiber

            if __name__ == "__main__":
                p = fiber.Process(target=abs, args=(-1,))
                p.start()
                p.join()
                print("exitcode", p.exitcode)
            """)
        assert result.returncode == 0 and "exitcode 0" in result.stdout, result.stderr
        assert dead not in shm.segments(gone.pid)
        assert live in shm.segments(os.getpid())
    finally:
        for name in (dead, live):
            try:
                os.unlink(os.path.join(shm.DIRECTORY, name))
            except FileNotFoundError:
                pass


# -- an honest log ----------------------------------------------------------------------
def test_clean_runs_print_nothing(run_script):
    """50 small two-worker maps (5 fresh programs of 10 pools each, the fiber logger
    sent to stderr at its default level): no program prints anything to stderr."""
    for _ in range(5):
        result = run_script(
            """
            import fiber

            def square(x):
                return x * x

            if __name__ == "__main__":
                fiber.log_to_stderr()
                for _ in range(10):
                    with fiber.Pool(2) as pool:
                        assert pool.map(square, range(20)) == [x * x for x in range(20)]
                print("ok")
            """, timeout=120)
        assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
        assert result.stderr == "", result.stderr
