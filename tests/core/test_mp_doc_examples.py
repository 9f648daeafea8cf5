"""The examples of multiprocessing's documentation (tests/mp_docs), run as scripts
with fiber, as a user who switches a program runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fiber.wire import shm

DOCS = Path(__file__).resolve().parent.parent / "mp_docs"


def _start(name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DOCS / name)], cwd=DOCS,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, env=dict(os.environ),
                            start_new_session=True)


def _runs(name: str, times: int, at_once: int, timeout: float,
          pids: list[int] | None = None) -> list[tuple[int, str, str]]:
    """Run the example ``times`` times, ``at_once`` at a time; (exit code, out, err)
    of each (and each run's pid appended to ``pids``). A run that does not end within
    ``timeout`` seconds is killed (code None)."""
    results: list[tuple[int, str, str]] = []
    while len(results) < times:
        batch = [_start(name) for _ in range(min(at_once, times - len(results)))]
        if pids is not None:
            pids.extend(proc.pid for proc in batch)
        deadline = time.monotonic() + timeout
        for proc in batch:
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # the whole session: its jobs hold the output pipes too
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                results.append((None, out, err))  # type: ignore[arg-type]
                continue
            results.append((proc.returncode, out, err))
    return results


def test_mp_workers_exits_every_time():
    """The queue example: test() puts the four STOPs and returns; the program must
    exit every time, each worker having got its STOP (it used to hang at exit in 5 of
    6 runs: the queue's items were dropped before the workers were joined)."""
    for code, out, err in _runs("mp_workers.py", times=20, at_once=4, timeout=60):
        assert code == 0, f"exit code {code}\n--- out\n{out}\n--- err\n{err}"
        lines = [line for line in out.splitlines() if " says that " in line]
        assert len(lines) == 30, out
        assert err == "", err


def test_lock_example_prints_every_line_every_time():
    """The Lock example starts ten children and never joins them: every child must
    print its line, every time (it printed 1 or 2 of 10 while the lock was a proxy of a
    manager stopped at exit before the children were joined), and no /dev/shm name is
    left behind."""
    pids: list[int] = []
    for code, out, err in _runs("lock.py", times=20, at_once=4, timeout=60, pids=pids):
        assert code == 0, f"exit code {code}\n--- out\n{out}\n--- err\n{err}"
        assert sorted(out.splitlines()) == sorted(f"hello world {i}" for i in range(10))
        assert err == ""
    # the names the runs' programs made (their pid is in the name): not the machine's
    # whole /dev/shm, where the other lanes' tests make and remove names of their own
    # meanwhile (the three-lane CI run of ba6f635 saw one's)
    assert [name for pid in pids for name in shm.state_names(pid)] == []


def test_customized_managers_example_prints_what_multiprocessing_prints(tmp_path):
    """The "customized managers and proxies" example (mp_newtype.py): fiber's output
    is multiprocessing's, line for line (the same program with multiprocessing
    imported is run beside it)."""
    source = (DOCS / "mp_newtype.py").read_text()
    with_mp = tmp_path / "mp_newtype_mp.py"
    with_mp.write_text(source.replace("from fiber", "from multiprocessing"))
    expected = subprocess.run([sys.executable, str(with_mp)], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert expected.returncode == 0, expected.stderr
    [(code, out, err)] = _runs("mp_newtype.py", times=1, at_once=1, timeout=60)
    assert code == 0, f"exit code {code}\n--- err\n{err}"
    assert err == "", err
    assert out == expected.stdout
    assert "<81>" in out and "op.add(23, 45) = 68" in out
