"""Records of the local backend's jobs, so that another process of the same user (the
``fiber jobs`` and ``fiber clean`` commands) can find and end them.

A local job is an ordinary process of this machine, and only the process that created
it holds its ``Popen``. Its environment cannot name it either: a job forked from the
template keeps the template's environment in ``/proc/<pid>/environ``, whatever it sets
in ``os.environ``. So the backend writes, for every job it creates, a small JSON file
``<pid>-<start time>.json`` into a directory private to the user, ``<temp dir>/fiber-local-jobs-<uid>``
(mode 0700; a directory of that name that another user owns or can enter is not
used: :func:`fiber.host.check_private`): the job's pid and start time (so that a reused pid is not taken for the job),
its name, labels and log file, and the pid and start time of its creator. Releasing the
job deletes the file; whoever lists the jobs deletes the files of processes that are
gone (a creator that was killed never released its jobs).

A local job is the leader of its own session and process group (the backend starts it
so), so terminating it by its pid reaches what it started, from any process.

The backend's log directory is named after its creator too
(``fiber-local-logs-<pid>-<start time>-<random>``, :func:`log_directory_prefix`), so
that ``fiber clean`` can remove the directory of a creator that was killed
(:func:`ended_log_directories`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fiber.host import private_directory, read_records, start_time, try_write_record

logger = logging.getLogger("fiber")


def directory() -> str:
    """The directory of this user's records (it may not exist yet)."""
    return os.path.join(tempfile.gettempdir(), f"fiber-local-jobs-{os.getuid()}")


def _private_directory(create: bool) -> str | None:
    """The records directory (see :func:`private_directory`)."""
    return private_directory(directory(), create)


@dataclass(frozen=True)
class Record:
    """One job as its record describes it."""

    pid: int
    started: int
    name: str
    labels: dict[str, str]
    log: str
    owner: int
    owner_started: int | None

    def alive(self) -> bool:
        """Whether the job's process is still running (and is the same process)."""
        return start_time(self.pid) == self.started

    def owner_alive(self) -> bool:
        return self.owner_started is not None and start_time(self.owner) == self.owner_started


def _file(pid: int, started: int) -> str:
    return os.path.join(directory(), f"{pid}-{started}.json")


_owner_known: tuple[int, int | None] | None = None  # (this pid, its start time)


def _owner() -> tuple[int, int | None]:
    """This process's pid and start time, read from /proc once per process (a forked
    child has another pid: it reads its own)."""
    global _owner_known
    pid = os.getpid()
    if _owner_known is None or _owner_known[0] != pid:
        _owner_known = (pid, start_time(pid))
    return _owner_known


def write(pid: int, name: str, labels: Mapping[str, str], log: str) -> int | None:
    """Record the job ``pid`` that this process has just created; returns its start
    time (what :func:`remove` needs), None when it was not recorded."""
    path = _private_directory(create=True)
    started = start_time(pid)
    if path is None or started is None:
        return None  # no private directory, or the job has ended already
    owner, owner_started = _owner()
    data = {"pid": pid, "started": started, "name": name, "labels": dict(labels),
            "log": log, "owner": owner, "owner_started": owner_started}
    final = _file(pid, started)
    return started if try_write_record(final, data, f"the record of local job {pid}") else None


def remove(pid: int, started: int) -> None:
    """Forget the job ``pid`` that started at ``started``."""
    try:
        os.unlink(_file(pid, started))
    except FileNotFoundError:
        pass


def _record_of(file: str, data: dict[str, Any]) -> Record:
    return Record(int(data["pid"]), int(data["started"]), str(data["name"]),
                  {str(k): str(v) for k, v in data["labels"].items()},
                  str(data["log"]), int(data["owner"]), data.get("owner_started"))


def read_all() -> Iterator[Record]:
    """The recorded jobs that are still running; records of ended ones are deleted."""
    path = _private_directory(create=False)
    if path is None:
        return
    for record in read_records(path, _record_of, "record"):
        if record.alive():
            yield record
        else:
            remove(record.pid, record.started)


# -- log directories ------------------------------------------------------------------
#: the start of the name of a local backend's log directory, in the temp directory:
#: ``fiber-local-logs-<creator pid>-<creator start time>-<random>``
LOG_PREFIX = "fiber-local-logs-"
_LOG_DIRECTORY = re.compile(r"fiber-local-logs-(\d+)-(\d+)-[A-Za-z0-9_]+\Z")


def log_directory_prefix() -> str:
    """The prefix of the log directory this process makes (it names this process, so
    that once the process is gone another one can tell that the directory is left)."""
    pid, started = _owner()
    return f"{LOG_PREFIX}{pid}-{started or 0}-"


@dataclass(frozen=True)
class LogDirectory:
    """A local backend's log directory whose creator has ended."""

    path: str
    creator: int
    size: int  # bytes of the files in it


def ended_log_directories() -> list[LogDirectory]:
    """This user's log directories (in the temp directory) whose creating process has
    ended and that no running job recorded here writes to: what a killed program left."""
    base = tempfile.gettempdir()
    try:
        names = os.listdir(base)
    except OSError:
        return []
    candidates = [(name, m) for name in names if (m := _LOG_DIRECTORY.match(name))]
    if not candidates:
        return []
    # (a job of a killed creator may still run and write its log there)
    in_use = {os.path.dirname(record.log) for record in read_all()}
    found = []
    for name, match in candidates:
        path = os.path.join(base, name)
        pid, started = int(match.group(1)), int(match.group(2))
        if path in in_use or start_time(pid) == started:
            continue
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            size = sum(entry.stat(follow_symlinks=False).st_size
                       for entry in os.scandir(path) if entry.is_file(follow_symlinks=False))
        except OSError:
            continue
        found.append(LogDirectory(path, pid, size))
    return found


def remove_log_directory(directory: LogDirectory) -> bool:
    """Delete a left log directory and the logs in it; whether it is gone."""
    shutil.rmtree(directory.path, ignore_errors=True)
    return not os.path.lexists(directory.path)
