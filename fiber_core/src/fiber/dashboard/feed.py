"""The dashboard's feed: asks the program for its snapshot while a page watches, keeps
the recent history the page plots, and shapes each snapshot into what the page shows.

A :class:`Feed` asks nothing while nobody watches: the first watcher (an open page's
event stream, :meth:`Feed.watch`) starts its poller thread, which asks the program
(:func:`fiber.runtime.status.query`, over the program's own authenticated connection)
every ``interval`` seconds and stops a few seconds after the last watcher left. Each
answer becomes a *view* (:func:`view`): per pool its counts, its workers aggregated by
host and by placement, at most :data:`WORKERS_SHOWN` workers listed (the rest counted),
the slowest tasks, the last errors and lost workers, its functions' task-time
histograms, its adaptation, and the history of its queue and throughput over the last
:data:`HISTORY_SECONDS` seconds (kept here, from the snapshots this feed asked for).
Watchers wait for the next view with :meth:`Feed.next`.

When the program cannot be reached and its process is gone, the view says it ended; a
question that fails any other way is said in the view (``error``), and the poller keeps
asking. The poller is a fiber thread (:mod:`fiber.threads`, kind
``fiber-dashboard-feed``): if it dies, its error is the pages' last view (``failed``),
and :meth:`Feed.next` and :meth:`Feed.watch` raise it from then on (the command ends
with it), rather than wait for views that will not come.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fiber import threads
from fiber.errors import AuthenticationError, ConnectionLostError, FiberThreadError
from fiber.runtime import status

__all__ = ["HISTORY_SECONDS", "WORKERS_SHOWN", "Feed", "view"]

HISTORY_SECONDS = 600.0  # the plots' span
WORKERS_SHOWN = 100  # workers listed per pool; the others are counted by host and state
GROUPS_SHOWN = 50  # hosts (placements) listed per pool, most workers first
LINGER = 5.0  # seconds the poller keeps asking after the last watcher left
QUERY_TIMEOUT = 5.0

# the order in which a pool's workers are listed: those that need a look first
_STATE_ORDER = {"pending": 0, "starting": 1, "busy": 2, "stopping": 3, "idle": 4}
STATES = ("pending", "starting", "busy", "idle", "stopping")


def _groups(workers: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The workers counted by state per value of ``key`` (host, placement), the
    largest groups first, at most :data:`GROUPS_SHOWN` (the rest in one row)."""
    counts: dict[str, dict[str, int]] = {}
    for w in workers:
        name = str(w.get(key) or "-")
        row = counts.setdefault(name, dict.fromkeys(STATES, 0))
        row[w["state"]] = row.get(w["state"], 0) + 1
    rows = sorted(counts.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    shown = [{"name": name, "total": sum(c.values()), **c} for name, c in rows[:GROUPS_SHOWN]]
    rest = rows[GROUPS_SHOWN:]
    if rest:
        other = {s: sum(c.get(s, 0) for _, c in rest) for s in STATES}
        shown.append({"name": f"{len(rest)} more", "total": sum(other.values()), **other})
    return shown


def _pool_view(pool: dict[str, Any], now: float,
               history: collections.deque[list[float]]) -> dict[str, Any]:
    workers = pool.get("worker_list") or []
    listed = sorted(workers, key=lambda w: (_STATE_ORDER.get(w["state"], 5), w["id"]))
    shown = []
    for w in listed[:WORKERS_SHOWN]:
        since = w.get("since") or 0.0
        shown.append({**w, "uptime": round(now - since, 1) if since else None})
    return {
        "id": pool["id"], "state": pool["state"], "processes": pool["processes"],
        "workers": pool["workers"], "tasks": pool["tasks"],
        "throughput": pool["throughput"], "task_seconds": pool.get("task_seconds"),
        "slowest": pool["slowest"], "errors": pool["errors"],
        "lost_list": pool.get("lost_list") or [], "functions": pool.get("functions") or [],
        "adapt": pool.get("adapt"),
        "by_host": _groups(workers, "host"), "by_placement": _groups(workers, "placement"),
        "worker_list": shown, "workers_hidden": max(0, len(workers) - len(shown)),
        "history": list(history),
    }


def view(snap: dict[str, Any], histories: dict[int, collections.deque[list[float]]],
         others: list[int]) -> dict[str, Any]:
    """What the page shows of the snapshot ``snap`` (histories: per pool id, rows of
    ``[time, queued, running, throughput, done, failed]``, already including it)."""
    now = snap["time"]
    return {
        "program": snap["program"], "time": now, "others": others,
        "pools": [_pool_view(p, now, histories.get(p["id"], collections.deque()))
                  for p in snap["pools"]],
    }


class Feed:
    """The views of one program, made while somebody watches (see the module)."""

    def __init__(self, program: status.Program, interval: float = 1.0,
                 query: Callable[[status.Program, float], dict[str, Any]] | None = None
                 ) -> None:
        self.program = program
        self.interval = interval
        self._query = query or (lambda p, timeout: status.query(p, timeout))
        self._cond = threading.Condition()
        self._watchers = 0
        self._left = 0.0  # when the last watcher left (time.monotonic())
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._latest = ""  # the last view, as JSON
        self._histories: dict[int, collections.deque[list[float]]] = {}
        self.ended = False  # the program has ended
        self.error: FiberThreadError | None = None  # the poller died (the command ends)
        self.polls = 0  # snapshots asked for (the tests check that nobody asks idly)

    @property
    def failure(self) -> str | None:
        """Why the poller died (None while it has not)."""
        return None if self.error is None else str(self.error)

    @contextmanager
    def watch(self) -> Iterator[None]:
        """While inside, the program is asked for a view every ``interval`` seconds.
        Raises :class:`~fiber.errors.FiberThreadError` once the poller has died."""
        with self._cond:
            if self.error is not None:
                raise self.error
            self._watchers += 1
            if self._thread is None:
                self._thread = threads.start("fiber-dashboard-feed", self._run,
                                             fails=self._died)
        try:
            yield
        finally:
            with self._cond:
                self._watchers -= 1
                self._left = time.monotonic()

    def next(self, seq: int, timeout: float) -> tuple[int, str]:
        """The view after number ``seq`` (0: the latest, if any), as JSON; ``(seq, "")``
        when none came within ``timeout`` seconds. Raises
        :class:`~fiber.errors.FiberThreadError` once the poller has died (its last view
        said so)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._seq <= seq or not self._latest:
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    return seq, ""
                self._cond.wait(left)
            return self._seq, self._latest

    def log(self, pool_id: int, wid: int) -> dict[str, Any]:
        """The tail of worker ``wid``'s job log, asked of the program now (``error``:
        why it could not be had)."""
        try:
            return status.query_log(self.program, pool_id, wid, QUERY_TIMEOUT)
        except (ConnectionLostError, AuthenticationError) as exc:
            return {"pool": pool_id, "worker": wid, "error": str(exc)}

    def _keep_going(self) -> bool:
        with self._cond:
            if self._watchers or time.monotonic() - self._left < LINGER:
                return True
            self._thread = None  # the next watcher starts another
            return False

    def _died(self, error: FiberThreadError) -> None:
        """The poller died (fiber.threads logged it): the pages' last view says so, and
        whoever waits for a view gets the error."""
        self._publish({"error": f"the dashboard stopped: {error}", "failed": True}, error)

    def _publish(self, data: dict[str, Any], error: FiberThreadError | None = None) -> None:
        text = json.dumps(data, separators=(",", ":"))
        with self._cond:  # (a failed view and its error together: no reader sees one alone)
            self._seq += 1
            self._latest = text
            if error is not None:
                self.error = error
                self._thread = None
            self._cond.notify_all()

    def _run(self) -> None:
        while not self.ended and self._keep_going():
            started = time.monotonic()
            self._poll()
            time.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def _poll(self) -> None:
        self.polls += 1
        try:
            snap = self._query(self.program, QUERY_TIMEOUT)
        except AuthenticationError as exc:
            self._publish({"error": f"program {self.program.pid} refused the secret of "
                                    f"its registration: {exc}"})
            return
        except ConnectionLostError as exc:
            if not self.program.alive():
                self.ended = True
                self._publish({"ended": True, "pid": self.program.pid})
            else:
                self._publish({"error": f"program {self.program.pid} did not answer: {exc}"})
            return
        for pool in snap["pools"]:
            rows = self._histories.setdefault(pool["id"], collections.deque())
            t = pool["tasks"]
            rows.append([round(snap["time"], 3), t["queued"], t["running"],
                         pool["throughput"], t["done"], t["failed"]])
            while rows and snap["time"] - rows[0][0] > HISTORY_SECONDS:
                rows.popleft()
        others = [p.pid for p in status.programs() if p.pid != self.program.pid]
        self._publish(view(snap, self._histories, others))
