"""The tracebacks of jobs that failed while preparing to run their process (importing
the parent's ``__main__``, unpickling the process object): the line that names the
exception (:func:`exception_line`, for the error the parent raises), and the whole
traceback printed on the parent's stderr once per distinct text (:func:`print_once`),
as a spawned multiprocessing child prints its own."""

from __future__ import annotations

import re
import sys
import threading

__all__ = ["exception_line", "print_once"]

_printed: set[str] = set()
_printed_lock = threading.Lock()

_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(: |$)")


def exception_line(text: str) -> str:
    """The first line of the exception a formatted traceback ends with."""
    lines = [line for line in text.splitlines() if _EXCEPTION_LINE.match(line)]
    return lines[-1] if lines else (text.splitlines() or ["(no traceback)"])[-1]


def print_once(text: str) -> None:
    """Print the traceback of a job that failed while preparing, as a spawned
    multiprocessing child prints its own, on the parent's stderr (where the job's
    output goes), once per distinct text: the workers of a pool that cannot start
    fail alike, and one copy says it all."""
    with _printed_lock:
        if text in _printed:
            return
        _printed.add(text)
    try:
        sys.stderr.write(f"{text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: the error still carries it
        pass
