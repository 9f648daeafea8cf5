"""The local backend's log directories that a test's killed fiber program leaves, found
and removed by the test itself.

A program whose process is killed (SIGKILL) never runs its exit path, so the log
directory its local backend made (``fiber-local-logs-<pid>-<start time>-<random>`` in the
temp directory, :mod:`fiber.backend.local.records`) stays; so does the directory of a
program that ended while one of its jobs still ran, once the test kills that job. A test
that does either runs the program with a temp directory of its own (:func:`own_tmpdir`,
as its ``TMPDIR``), so that what the program leaves is told apart from what other runs on
the machine, live or not, have there; then :func:`remove_left_logs` removes what the
program left by ``fiber clean``'s rule (a directory whose creator has ended and that no
running job writes to) and asserts that nothing of it is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from fiber.backend.local.records import LOG_PREFIX

# run with the program's TMPDIR: fiber clean's removal of log directories, alone (the
# command would also remove the shared memory of every ended program on the machine)
_REMOVE = """
from fiber.backend.local import records
for directory in records.ended_log_directories():
    records.remove_log_directory(directory)
"""


def own_tmpdir(tmp_path: Path) -> str:
    """A new temp directory for one program (its ``TMPDIR``) under ``tmp_path``."""
    path = tmp_path / "tmp"
    path.mkdir(mode=0o700, exist_ok=True)
    return str(path)


def log_directories(tmpdir: str) -> list[str]:
    """The local backend's log directories in ``tmpdir``."""
    return sorted(name for name in os.listdir(tmpdir) if name.startswith(LOG_PREFIX))


def remove_left_logs(tmpdir: str, timeout: float = 60.0) -> list[str]:
    """Remove the log directories that ended programs left in ``tmpdir``, waiting up to
    ``timeout`` seconds for the jobs that still write to one to end; AssertionError when
    one is still there. Returns the names of those it found."""
    found = log_directories(tmpdir)
    deadline = time.monotonic() + timeout
    while True:
        subprocess.run([sys.executable, "-c", _REMOVE], env={**os.environ, "TMPDIR": tmpdir},
                       check=True, timeout=60)
        left = log_directories(tmpdir)
        if not left:
            return found
        if time.monotonic() > deadline:
            contents = {name: os.listdir(os.path.join(tmpdir, name)) for name in left}
            raise AssertionError(f"log directories left in {tmpdir} {timeout} s after the "
                                 f"program: {contents}")
        time.sleep(0.5)
