"""The journals this program has open, one :class:`~fiber.runtime.journal.store.Journal`
per file shared by the pools given it, and the numbering of durable calls per file,
which goes on across pools: a program that makes a new pool with the same journal
(a pool per phase, say) numbers its calls after those of the pool before, in every run.
Journals still open at exit are committed and closed then."""

from __future__ import annotations

import os
import threading

from fiber import util
from fiber.runtime.journal.store import Journal

__all__ = ["acquire", "release"]

_lock = threading.Lock()
_open: dict[str, tuple[Journal, int]] = {}  # path -> (journal, pools using it)
_next_call: dict[str, int] = {}  # path -> the number of its next durable call


def acquire(path: str | os.PathLike[str]) -> Journal:
    """The open journal at ``path``, opened now if no pool of this program has it."""
    key = os.path.abspath(os.fspath(path))
    with _lock:
        entry = _open.get(key)
        if entry is not None:
            journal, users = entry
            _open[key] = (journal, users + 1)
            return journal
        journal = Journal(key, first_call=_next_call.get(key, 0))
        _open[key] = (journal, 1)
        # after the pools' workers are ended (their last results journaled)
        util.at_exit("journals", util.CHILDREN - 2, close_all)
        return journal


def release(journal: Journal) -> None:
    """A pool is done with ``journal``: closed once no pool uses it (raising the error
    of a write that failed)."""
    with _lock:
        journal_, users = _open.get(journal.path, (None, 0))
        if journal_ is not journal:
            return
        if users > 1:
            _open[journal.path] = (journal, users - 1)
            return
        del _open[journal.path]
        _next_call[journal.path] = journal.next_call
    journal.close()


def close_all() -> None:
    """Commit and close every open journal (at exit)."""
    with _lock:
        journals = [journal for journal, _ in _open.values()]
        _open.clear()
    for journal in journals:
        try:
            journal.close()
        except Exception:  # noqa: BLE001 - logged by the journal when it failed
            pass
