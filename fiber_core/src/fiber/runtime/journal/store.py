"""The journal of a durable pool (``fiber.Pool(journal=path)``): an SQLite database
in one file, holding each result of the pool's durable calls as it arrives.

* **One program at a time.** The database is opened in SQLite's exclusive locking mode
  and written at once, so this process holds its lock until it closes the journal (or
  dies: the kernel drops the lock with the process). A second program opening the same
  file is refused with :class:`~fiber.errors.JournalError`. Exclusive mode also keeps
  WAL's index in this process's memory, not in a shared-memory file, so a journal on a
  network filesystem that honours POSIX locks works as a local one.
* **Write-ahead log, written in batches.** Results are queued by the thread that
  delivers them (pickled there, so a value the program changes afterwards is journaled
  as it was) and committed by the journal's writer thread at least every
  :data:`BATCH_SECONDS`. A crash of the program loses at most the results of the last
  interval, which a re-run computes again; a write torn by the crash is rolled back by
  SQLite when the journal is next opened.
* **Nothing wrong is ever answered.** Each value is stored with a hash of its bytes,
  checked when it is read back; a journal whose file or rows are damaged raises
  :class:`~fiber.errors.JournalError` naming the file, never a wrong result.
* **A write that fails** (a full disk, a file removed) does not fail the pool's results:
  the calls still return them; the error is logged once and raised by the next
  durable call and when the pool is closed (the journal stays readable: SQLite rolls
  the failed batch back).

The tables: ``meta`` (the format), ``calls`` (the n-th durable call of the program:
its function's identity and kind) and ``results`` (call, position, item hash, value,
value hash).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import sqlite3
import threading
import time
from typing import Any

from fiber import threads
from fiber.errors import FiberThreadError, JournalError

__all__ = ["BATCH_SECONDS", "FORMAT", "Journal", "Known"]

logger = logging.getLogger("fiber")

#: the journal's format; a journal of another format is refused (not rewritten)
FORMAT = 1
#: results are committed at least this often (what a crash of the program can lose)
BATCH_SECONDS = 0.2
#: and at most this many in one transaction
BATCH_ROWS = 8192
#: how long opening waits for another program's lock before refusing
LOCK_SECONDS = 0.5

_CHECK = 8  # bytes of a value's hash

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (call INTEGER PRIMARY KEY, func TEXT NOT NULL,
                                  kind TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (call INTEGER NOT NULL, pos INTEGER NOT NULL,
                                    item BLOB NOT NULL, value BLOB NOT NULL,
                                    checked BLOB NOT NULL, PRIMARY KEY (call, pos))
                                    WITHOUT ROWID;
"""

#: what a call's journaled results are: position -> (item hash, pickled value)
Known = dict[int, tuple[bytes, bytes]]

_FLUSH, _CLOSE = "flush", "close"


def value_check(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=_CHECK).digest()


class Journal:
    """An open journal: :meth:`begin` numbers a durable call and returns what the
    journal already holds of it; :meth:`add` queues a result (from any thread, never
    raising); :meth:`check` raises a failed write; :meth:`close` commits and closes."""

    def __init__(self, path: str | os.PathLike[str], first_call: int = 0) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._con = _open(self.path)
        self._lock = threading.Lock()  # the connection, between the writer and begin()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failure: JournalError | None = None
        self._reported = False  # the failure was raised to the program
        self.next_call = first_call
        self._warned_changed = False
        self.closed = False
        self._writer = threads.start("fiber-journal", self._write_loop,
                                     name=f"fiber-journal-{os.path.basename(self.path)}",
                                     fails=self._died)

    # -- calls --------------------------------------------------------------------------
    def begin(self, func: str, kind: str) -> tuple[int, Known]:
        """Number the next durable call (made with the function of identity ``func``)
        and return ``(number, results the journal holds of it)``; a journaled call of
        that number made with another function (or another kind of call) is forgotten,
        its results computed again."""
        self.check()
        call = self.next_call
        self.next_call += 1
        changed = False
        with self._lock:
            try:
                row = self._con.execute("SELECT func, kind FROM calls WHERE call = ?",
                                        (call,)).fetchone()
                if row is None:
                    known: Known = {}
                elif tuple(row) != (func, kind):
                    known, changed = {}, True
                    if not self._warned_changed:
                        self._warned_changed = True
                        logger.warning(
                            "journal %s: durable call %d was made with another function "
                            "(or another version of it: %s, now %s); its results, and "
                            "those of any later call that changed, are computed again",
                            self.path, call, row[0], func)
                else:
                    known = self._read(call)
            except sqlite3.DatabaseError as exc:
                raise _damaged(self.path, exc) from exc
        if row is None or changed:
            self._queue.put(("call", call, func, kind))
        return call, known

    def _read(self, call: int) -> Known:
        known: Known = {}
        for pos, item, value, checked in self._con.execute(
                "SELECT pos, item, value, checked FROM results WHERE call = ?", (call,)):
            if value_check(value) != checked:
                raise JournalError(
                    f"journal {self.path} is damaged: the result at position {pos} of "
                    f"durable call {call} does not match its hash. No result was taken "
                    "from it; move the file away to start afresh (its results are then "
                    "computed again)")
            known[pos] = (item, value)
        return known

    def add(self, call: int, rows: list[tuple[int, bytes, bytes]]) -> None:
        """Queue results of ``call``: ``(position, item hash, pickled value)`` rows."""
        if rows:
            self._queue.put(("rows", call, rows))

    def check(self) -> None:
        """Raise the error of a write that failed (see the module)."""
        if self._failure is not None:
            self._reported = True
            raise self._failure
        if self.closed:
            raise JournalError(f"journal {self.path} is closed")

    # -- ending -------------------------------------------------------------------------
    def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until everything queued so far is committed."""
        if self.closed or not self._writer.is_alive():
            return
        done = threading.Event()
        self._queue.put((_FLUSH, done))
        done.wait(timeout)

    def close(self) -> None:
        """Commit what is queued and close the database (releasing its lock); raises
        the error of a write that failed, unless a durable call raised it already."""
        if self.closed:
            return
        self.closed = True
        if self._writer.is_alive():
            self._queue.put((_CLOSE,))
            self._writer.join(30.0)
        with self._lock:
            try:
                self._con.close()
            except sqlite3.Error:  # pragma: no cover - closing a broken connection
                logger.debug("journal %s: close failed", self.path, exc_info=True)
        if self._failure is not None and not self._reported:
            self._reported = True
            raise self._failure

    # -- the writer thread --------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            ops = [self._queue.get()]
            deadline = time.monotonic() + BATCH_SECONDS
            rows = 0
            while ops[-1][0] not in (_FLUSH, _CLOSE) and rows < BATCH_ROWS:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    op = self._queue.get(timeout=left)
                except queue.Empty:
                    break
                ops.append(op)
                if op[0] == "rows":
                    rows += len(op[2])
            self._commit(ops)
            for op in ops:
                if op[0] == _FLUSH:
                    op[1].set()
            if ops[-1][0] == _CLOSE:
                return

    def _commit(self, ops: list[Any]) -> None:
        if self._failure is not None:
            return  # (the error stands; what comes after it is not journaled)
        with self._lock:
            con = self._con
            try:
                con.execute("BEGIN")
                for op in ops:
                    if op[0] == "rows":
                        call = op[1]
                        con.executemany(
                            "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)",
                            [(call, pos, item, value, value_check(value))
                             for pos, item, value in op[2]])
                    elif op[0] == "call":
                        _, call, func, kind = op
                        con.execute("DELETE FROM results WHERE call = ?", (call,))
                        con.execute("INSERT OR REPLACE INTO calls VALUES (?, ?, ?)",
                                    (call, func, kind))
                con.execute("COMMIT")
            except sqlite3.Error as exc:
                try:
                    con.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._failure = JournalError(
            f"journal {self.path}: writing failed ({exc}); the results from then on are "
            "not journaled (a re-run computes them again). Free space or fix the file, "
            "then run the program again")
        self._failure.__cause__ = exc
        logger.error("journal %s: writing failed (%s); the results from then on are not "
                     "journaled", self.path, exc)

    def _died(self, error: FiberThreadError) -> None:
        self._fail(error)


def _open(path: str) -> sqlite3.Connection:
    """Connect to the journal at ``path`` (made if missing), take its lock, make or
    check its tables."""
    if os.path.isdir(path):
        raise JournalError(f"journal {path} is a directory: give the path of a file")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise JournalError(f"journal {path}: its directory {parent} does not exist")
    try:
        con = sqlite3.connect(path, timeout=LOCK_SECONDS, isolation_level=None,
                              check_same_thread=False)
    except sqlite3.Error as exc:
        raise JournalError(f"cannot open journal {path}: {exc}") from exc
    try:
        con.execute("PRAGMA locking_mode = EXCLUSIVE")
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = NORMAL")
        con.executescript(_SCHEMA)
        row = con.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
        if row is not None and row[0] != str(FORMAT):
            raise JournalError(
                f"journal {path} has format {row[0]}, this fiber writes format {FORMAT}: "
                "use another path (or move the file away) for this program's journal")
        check = con.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(check)
        # a write each time: in exclusive mode, the lock is held from the first write
        con.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (str(FORMAT),))
    except JournalError:
        con.close()
        raise
    except sqlite3.OperationalError as exc:
        con.close()
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise JournalError(
                f"journal {path} is in use by another program (it holds the journal's "
                "lock): a journal is written by one program at a time. Wait for it to "
                "end, or give this one another journal") from exc
        if "malformed" in text or "not a database" in text:
            raise _damaged(path, exc) from exc
        raise JournalError(f"cannot write journal {path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:
        con.close()
        raise _damaged(path, exc) from exc
    return con


def _damaged(path: str, exc: BaseException) -> JournalError:
    return JournalError(
        f"journal {path} is damaged or not a journal ({exc}). No result was taken from "
        "it; move the file away to start afresh (its results are then computed again)")
