"""Run records: which runs have a live main process on this machine, so that ``fiber
clean`` can tell the jobs of an ended program (orphans) from those of a running one.

Every job carries its run's id in its labels (``fiber.run``) on every backend; what a
label cannot say is whether the program that made the job still runs. So the main
process of a program (not a job), when it first opens a hub for jobs, writes a *run
record* ``<run>-<pid>-<start time>.json`` into ``<temp dir>/fiber-runs-<uid>``, a
directory private to the user (mode 0700, as the local backend's job records): the run
id, its pid and start time (so that a reused pid is not taken for it), this machine's
boot id and host name, and the backend. ``fiber run`` writes one for the run it starts
too (its job is the program's main process; while that job runs, the run is live).

:func:`state` answers for a run: ``live`` when a recorded main process runs,
``ended`` when every recorded one is gone (killed: ``kill -9`` skips the exit path),
``unknown`` when no record is here (a main process on another machine, or a program
of a fiber version that wrote none). Only ``ended`` proves that a run's jobs are
orphans; ``fiber clean`` treats ``unknown`` as live.

At a clean exit the main process removes its record, unless some of its jobs could not
be ended (the cluster did not answer): then the record stays, so that ``fiber clean``
knows those jobs as orphans, and ``fiber clean`` removes it once no job of the run is
left on the record's backend.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from fiber import util
from fiber.host import private_directory, read_records, start_time, try_write_record

__all__ = ["LIVE", "ENDED", "UNKNOWN", "RunRecord", "directory", "forget", "read_all",
           "register", "state"]

logger = logging.getLogger("fiber")

LIVE: Literal["live"] = "live"
ENDED: Literal["ended"] = "ended"
UNKNOWN: Literal["unknown"] = "unknown"
State = Literal["live", "ended", "unknown"]

_lock = threading.Lock()
_written: dict[str, str] = {}  # run -> this process's record file
_written_pid: int | None = None


def directory() -> str:
    """The directory of this user's run records (it may not exist yet)."""
    return os.path.join(tempfile.gettempdir(), f"fiber-runs-{os.getuid()}")


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class RunRecord:
    """One main process of a run, as its record describes it."""

    run: str
    pid: int
    started: int
    boot: str
    host: str
    backend: str
    path: str

    def here(self) -> bool:
        """Whether the record's process ran on this machine since its last boot."""
        return self.host == socket.gethostname() and self.boot == _boot_id()

    def alive(self) -> bool:
        """Whether the main process still runs (or may: one on another host does)."""
        if self.host != socket.gethostname():
            return True  # a shared temp directory: nothing can be proved from here
        if self.boot != _boot_id():
            return False  # the machine has rebooted since
        return start_time(self.pid) == self.started


def register(run: str, backend: str) -> None:
    """Record that this process is a main process of ``run`` (once per process and
    run); the record goes at this process's exit unless jobs were left running."""
    global _written_pid
    pid = os.getpid()
    with _lock:
        if _written_pid != pid:  # (a forked child starts afresh)
            _written.clear()
            _written_pid = pid
        if run in _written:
            return
        path = private_directory(directory(), create=True)
        started = start_time(pid)
        if path is None or started is None:
            return
        data = {"run": run, "pid": pid, "started": started, "boot": _boot_id(),
                "host": socket.gethostname(), "backend": backend, "argv": sys.argv}
        final = os.path.join(path, f"{run}-{pid}-{started}.json")
        if not try_write_record(final, data, "the run record"):
            return
        first = not _written
        _written[run] = final
    if first:
        # after the children were ended and the jobs left were reported (CHILDREN)
        util.at_exit("run records", util.SHARED_MEMORY, _unregister)


def _unregister() -> None:
    from fiber.runtime import teardown

    if teardown.left_running():
        logger.debug("keeping the run records %s: jobs may be left running",
                     ", ".join(_written.values()))
        return
    with _lock:
        if _written_pid != os.getpid():
            return
        files = list(_written.values())
        _written.clear()
    for path in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _record_of(file: str, data: dict[str, Any]) -> RunRecord:
    return RunRecord(str(data["run"]), int(data["pid"]), int(data["started"]),
                     str(data["boot"]), str(data["host"]), str(data["backend"]), file)


def read_all() -> Iterator[RunRecord]:
    """Every run record of this user on this machine."""
    path = private_directory(directory(), create=False)
    if path is None:
        return
    yield from read_records(path, _record_of, "run record")


def state(run: str, records: list[RunRecord] | None = None) -> State:
    """Whether ``run``'s program is ``live``, has ``ended`` (every recorded main
    process is gone) or is ``unknown`` here (no record: count it as live)."""
    mine = [r for r in (read_all() if records is None else records) if r.run == run]
    if not mine:
        return UNKNOWN
    return LIVE if any(r.alive() for r in mine) else ENDED


def forget(record: RunRecord) -> None:
    """Delete the record of a main process that has ended."""
    try:
        os.unlink(record.path)
    except FileNotFoundError:
        pass
