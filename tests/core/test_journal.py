"""Durable pools (``fiber.Pool(journal=path)``, docs/durable.md): results journaled as
they arrive, a re-run answered from the journal, and every bad journal a clear error.

The programs run as their own processes (tests/journal_programs.py), as a user's do,
so that killing one with SIGKILL is the crash the journal is for."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fiber
from fiber.errors import JournalError
from fiber.runtime.journal import registry

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

import journal_programs as programs  # noqa: E402
from left_logs import own_tmpdir, remove_left_logs  # noqa: E402
from procs import processes_with  # noqa: E402

PROGRAM = str(TESTS / "journal_programs.py")


def _env(runs: Path, tmpdir: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    return env


def run_map(journal: Path, runs: Path, n: int, version: int = 1, timeout: float = 120,
            **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, PROGRAM, "map", str(journal), str(runs), str(n),
                          str(version)], env=_env(runs, **env), capture_output=True,
                         text=True, timeout=timeout)
    return out


def result_digest(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split("RESULTS ")[1].split()[0]


def square(x):
    return x * x


def test_a_rerun_takes_every_result_from_the_journal(tmp_path):
    journal, runs = tmp_path / "j.db", tmp_path / "runs"
    first = run_map(journal, runs, 200)
    assert result_digest(first) == programs.digest(programs.expected(200))
    assert sorted(programs.runs(str(runs))) == list(range(200))
    os.unlink(runs)
    second = run_map(journal, runs, 200)
    assert result_digest(second) == programs.digest(programs.expected(200))
    assert programs.runs(str(runs)) == {}, "a journaled task ran again"
    # more items: only the new ones run
    third = run_map(journal, runs, 250)
    assert result_digest(third) == programs.digest(programs.expected(250))
    assert sorted(programs.runs(str(runs))) == list(range(200, 250))


def test_another_version_of_the_function_is_computed_again(tmp_path):
    journal, runs = tmp_path / "j.db", tmp_path / "runs"
    result_digest(run_map(journal, runs, 50, version=1))
    os.unlink(runs)
    out = run_map(journal, runs, 50, version=3)
    assert result_digest(out) == programs.digest(programs.expected(50, 3))
    assert sorted(programs.runs(str(runs))) == list(range(50)), "answered from the journal"
    assert "another function" in out.stderr  # one log line says why


def tally(item):
    """``x * x`` of ``item = (x, path)``, appending ``x`` to the file ``path``."""
    x, path = item
    with open(path, "a") as f:
        f.write(f"{x}\n")
    return x * x


def tally_pow(x, y, path):
    tally((x, path))
    return x ** y


def test_every_flavour_is_journaled_and_replayed(tmp_path):
    journal, runs = tmp_path / "j.db", str(tmp_path / "runs")

    def calls(pool):
        return (pool.map(tally, [(x, runs) for x in range(30)]),
                pool.starmap(tally_pow, [(2, 5, runs), (3, 3, runs)]),
                pool.apply_async(tally, ((12, runs),)).get(), pool.apply(tally, ((13, runs),)),
                list(pool.imap(tally, [(x, runs) for x in range(40, 45)])),
                sorted(pool.imap_unordered(tally, [(x, runs) for x in range(50, 55)])),
                pool.map_async(tally, [(7, runs), (8, runs)]).get(),
                pool.starmap_async(tally_pow, [(5, 2, runs)]).get())

    want = ([x * x for x in range(30)], [32, 27], 144, 169, [x * x for x in range(40, 45)],
            [x * x for x in range(50, 55)], [49, 64], [25])
    with fiber.Pool(2, journal=journal) as pool:
        assert calls(pool) == want
    assert sum(programs.runs(runs).values()) == 30 + 2 + 1 + 1 + 5 + 5 + 2 + 1
    con = sqlite3.connect(journal)
    assert con.execute("SELECT COUNT(*) FROM calls").fetchone()[0] == 8
    assert con.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 47
    con.close()
    # the same calls as a re-run makes them (numbered from the first): all journaled
    os.unlink(runs)
    registry._next_call.pop(str(journal))
    with fiber.Pool(2, journal=journal) as pool:
        assert calls(pool) == want
    assert programs.runs(runs) == {}, "a journaled task ran again"


def test_a_function_has_the_same_identity_in_every_run():
    """String hashes are salted per process: nothing of a function's identity may
    depend on the order of a set or dict of names."""
    code = ("import sys; sys.argv = ['p', 'map', 'j', 'r', '5']; "
            "import journal_programs as p; "
            "from fiber.runtime.journal import identity; "
            "print(identity.function_identity(p.square))")
    seen = {subprocess.run([sys.executable, "-c", code], cwd=TESTS, capture_output=True,
                           text=True, timeout=60, env={**os.environ, "PYTHONHASHSEED": seed}
                           ).stdout for seed in ("1", "2", "3", "4")}
    assert len(seen) == 1 and "journal_programs.square:" in seen.pop()


def test_another_constant_is_another_function():
    from fiber.runtime.journal import identity

    def make(scale):
        def scaled(x):
            return x * scale
        return scaled

    assert identity.function_identity(make(2)) != identity.function_identity(make(3))
    assert identity.function_identity(make(2)) == identity.function_identity(make(2))


def test_a_second_program_on_the_same_journal_is_refused(tmp_path):
    journal, runs = tmp_path / "j.db", tmp_path / "runs"
    holder = subprocess.Popen([sys.executable, PROGRAM, "map", str(journal), str(runs), "400"],
                              env=_env(runs, JOURNAL_TEST_TASK_SECONDS="0.05"),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "STARTED"
        started = time.monotonic()
        with pytest.raises(JournalError, match="in use by another program"):
            fiber.Pool(1, journal=journal)
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("case", ["missing directory", "a directory", "not writable"])
def test_a_journal_path_that_cannot_be_written_is_a_clear_error(tmp_path, case):
    path = {"missing directory": tmp_path / "nowhere" / "j.db",
            "a directory": tmp_path,
            "not writable": Path("/proc/fiber-journal.db")}[case]
    started = time.monotonic()
    with pytest.raises(JournalError, match=str(path)):
        fiber.Pool(1, journal=path)
    assert time.monotonic() - started < 5


def test_a_file_that_is_not_a_journal_is_refused_by_name(tmp_path):
    path = tmp_path / "j.db"
    path.write_bytes(b"this is not an sqlite database\n" * 200)
    with pytest.raises(JournalError, match=f"{path}.*damaged or not a journal"):
        fiber.Pool(1, journal=path)


def test_a_damaged_result_is_never_answered(tmp_path):
    journal, runs = tmp_path / "j.db", tmp_path / "runs"
    result_digest(run_map(journal, runs, 20))
    con = sqlite3.connect(journal)
    con.execute("UPDATE results SET value = ? WHERE pos = 7", (b"\x80\x05K\x63.",))  # 99
    con.commit()
    con.close()
    out = run_map(journal, runs, 20)
    assert out.returncode != 0
    assert "JournalError" in out.stderr and str(journal) in out.stderr
    assert "does not match its hash" in out.stderr


def test_a_torn_journal_is_recovered_on_open(tmp_path):
    """A program killed while its writer commits leaves a write-ahead log with a torn
    last frame; the next open rolls it back and answers what was committed."""
    journal, runs = tmp_path / "j.db", tmp_path / "runs"
    result_digest(run_map(journal, runs, 100))
    # a program killed with its log not checkpointed: the log's last frame torn
    script = (
        "import sqlite3, os, sys\n"
        "con = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "con.execute('PRAGMA journal_mode=WAL')\n"
        "con.execute('PRAGMA wal_autocheckpoint=0')\n"
        "con.execute('BEGIN')\n"
        "con.execute('DELETE FROM results WHERE pos >= 50')\n"
        "con.execute('COMMIT')\n"
        "os.kill(os.getpid(), 9)\n")
    subprocess.run([sys.executable, "-c", script, str(journal)], timeout=60)
    wal = Path(str(journal) + "-wal")
    assert wal.exists() and wal.stat().st_size > 0
    with open(wal, "r+b") as f:  # tear the last frame
        f.truncate(wal.stat().st_size - 100)
    os.unlink(runs)
    out = run_map(journal, runs, 100)
    assert result_digest(out) == programs.digest(programs.expected(100))
    # the torn transaction (the delete) was rolled back: every result is still there
    assert programs.runs(str(runs)) == {}


def test_an_unpicklable_result_fails_its_task_and_writes_nothing(tmp_path):
    journal = tmp_path / "j.db"
    with fiber.Pool(1, journal=journal) as pool:
        with pytest.raises(Exception, match="pickle"):
            pool.apply(_lock_maker)
        assert pool.apply(square, (3,)) == 9
    con = sqlite3.connect(journal)
    assert con.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 1
    con.close()


def _lock_maker():
    import threading

    return threading.Lock()


@pytest.mark.skipif(os.geteuid() != 0, reason="a small filesystem needs root (mount)")
def test_a_disk_that_fills_is_a_clear_error_and_the_journal_stays_readable(tmp_path):
    """A real full disk: the program runs in a mount namespace of its own on a 512 KB
    tmpfs (gone with the namespace), beside a file of 128 KB that is removed once the
    program has failed, as a user frees space; the journal then opens and holds what
    was committed before the disk filled."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    runs = tmp_path / "runs"
    body = (
        f"mount -t tmpfs -o size=512k fiber-journal-test {mnt} && "
        f"head -c 131072 /dev/zero > {mnt}/filler && "
        f"{sys.executable} -c '"
        "import fiber, sys\n"
        "def big(i):\n"
        "    return bytes(4096) + str(i).encode()\n"
        "pool = fiber.Pool(2, journal=sys.argv[1])\n"
        "first = pool.map(big, range(10))\n"
        "import time; time.sleep(1)\n"  # (committed: older than the batch interval)
        "try:\n"
        "    pool.map(big, range(10, 200))\n"
        "    import time; time.sleep(1)\n"
        "    pool.map(big, range(200, 210))\n"
        "except Exception as exc:\n"
        "    print(\"RAISED\", type(exc).__name__, exc)\n"
        "pool.terminate()\n"
        f"' {mnt}/j.db && rm {mnt}/filler && {sys.executable} -c '"
        "import sqlite3, sys\n"
        "con = sqlite3.connect(sys.argv[1])\n"
        "print(\"CHECK\", con.execute(\"PRAGMA integrity_check\").fetchone()[0])\n"
        "print(\"READABLE\", con.execute(\"SELECT COUNT(*) FROM results WHERE call = 0\").fetchone()[0])\n"
        f"' {mnt}/j.db")
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", body],
                         env=_env(runs), capture_output=True, text=True, timeout=120)
    assert "RAISED JournalError" in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "writing failed" in out.stdout and "full" in out.stdout
    assert "READABLE " in out.stdout, (out.stdout, out.stderr[-3000:])
    assert "CHECK ok" in out.stdout
    assert int(out.stdout.split("READABLE ")[1].split()[0]) == 10


def test_kill_the_master_anywhere_and_rerun(tmp_path):
    """kill -9 of the master at 20 random points of a 10,000-task map, then a re-run:
    the results equal a serial run's every time, no task ran more than twice across
    both runs, and nothing of the killed program is left running."""
    tmpdir = own_tmpdir(tmp_path)

    def left_running(tag: str) -> list[int]:
        return processes_with(f"JOURNAL_TEST_TAG={tag}\0")

    programs.kill_and_rerun(tmp_path, 20, {"TMPDIR": tmpdir}, left_running)
    remove_left_logs(tmpdir)
