"""What a running program tells ``fiber top``, and how ``fiber top`` finds it.

The program side. When a process creates its first :class:`fiber.Pool`, it adds a
*status channel* to the hub it already has (the one its children connect to): nothing
new listens, and the channel answers only connections that proved they hold the run's
secret (the hub's handshake), like every other channel. A
:data:`~fiber.wire.protocol.StatusOp.SNAPSHOT` request is answered with JSON: the
program (pid, command line, run id, backend) and, per pool it has (held weakly), its
:meth:`~fiber.Pool.stats`, workers and tasks, throughput, the slowest tasks in
progress and the last errors with their remote tracebacks. A request costs one pass
over each pool's workers under its lock; the pool itself pays nothing per task for it
(:mod:`fiber.runtime.pool.observe`).

So that ``fiber top`` can find the program, the process writes a *registration*
``<pid>-<start time>.json`` into ``<temp dir>/fiber-status-<uid>``, a directory private
to the user (mode 0700; one that another user owns or can enter is not used: the
program logs a warning and ``fiber top`` says why it cannot look, and where), with
mode 0600: the hub's address, the channel's number and the run's secret. It always
does (one small file per program that has a pool); it removes the file at exit, and
whoever lists the registrations (:func:`programs`) deletes those of processes that are
gone (a program that was killed never removed its own). A user who can read the file
could read the secret from the program's environment anyway.

The reading side (:func:`programs`, :func:`query`) is what the ``fiber top`` command
uses.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fiber import threads, util
from fiber._version import __version__
from fiber.backend.job import JobState
from fiber.errors import NotPrivateError
from fiber.host import check_private, read_records, start_time, try_write_record
from fiber.runtime import config, monitor
from fiber.runtime import run as run_module
from fiber.wire import transport
from fiber.wire.protocol import ERROR, StatusOp

__all__ = ["Program", "directory", "programs", "query", "query_log", "register_pool",
           "snapshot", "worker_log"]

logger = logging.getLogger("fiber")

_lock = threading.Lock()
_pools: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_pool_ids = itertools.count(1)
_registered: str | None = None  # this process's registration file
_registered_pid: int | None = None
_started_wall = time.time()
_refused_warned = False


def directory() -> str:
    """The directory of this user's registrations (it may not exist yet)."""
    return os.path.join(tempfile.gettempdir(), f"fiber-status-{os.getuid()}")


def _private_directory(create: bool) -> str | None:
    """The registrations' directory (None when missing); raises NotPrivateError when it
    is not private to this user (someone else could read the secrets in it)."""
    return check_private(directory(), create)


# -- the program side -----------------------------------------------------------------
class StatusChannel:
    """The hub channel that answers ``fiber top``."""

    def handle(self, request: transport.Request, payload: memoryview) -> None:
        op = bytes(payload[:1])
        if op == StatusOp.SNAPSHOT:
            make: Any = snapshot
        elif op == StatusOp.LOG:
            try:
                asked = json.loads(bytes(payload[1:]).decode())
                pool_id, wid = int(asked["pool"]), int(asked["worker"])
            except (ValueError, KeyError, TypeError):
                request.reply(b"bad log request", ERROR)
                return
            make = lambda: worker_log(pool_id, wid)  # noqa: E731
        else:
            request.reply(b"unknown status request", ERROR)
            return
        # answered from a thread of its own: the hub's thread, which serves every
        # channel, must not wait for a pool's lock (held while a large map is queued),
        # nor for a backend's log
        threads.start("fiber-status", _answer, request, make,
                      fails=lambda error: request.reply(str(error).encode(), ERROR))

    def peer_gone(self, peer: int) -> None:
        pass


def _answer(request: transport.Request, make: Any) -> None:
    try:
        data = json.dumps(make()).encode()
    except Exception as exc:  # noqa: BLE001 - the requester gets the error, not a hang
        logger.debug("status snapshot failed", exc_info=True)
        request.reply(f"status snapshot failed: {type(exc).__name__}: {exc}".encode(), ERROR)
        return
    request.reply(data)


def register_pool(pool: Any, hub: transport.Hub) -> None:
    """Show ``pool`` (anything with ``stats()``) to ``fiber top``; the first call of a
    process adds the status channel to ``hub`` and writes the registration."""
    global _registered, _registered_pid
    with _lock:
        _pools[next(_pool_ids)] = pool
        if _registered_pid == os.getpid():
            return
        _registered_pid = os.getpid()
        cid = hub.add_channel(StatusChannel())
        _registered = _write_registration(hub.address, cid, hub.authkey)
    if _registered is not None:
        util.at_exit("status registration", util.MANAGERS + 5, _unregister)


def _write_registration(address: str, cid: int, authkey: bytes) -> str | None:
    global _refused_warned
    try:
        path = _private_directory(create=True)
    except NotPrivateError as exc:
        if not _refused_warned:
            _refused_warned = True
            logger.warning("%s (fiber top cannot show this program)", exc)
        return None
    pid = os.getpid()
    started = start_time(pid)
    if path is None or started is None:
        return None
    data = {"pid": pid, "started": started, "address": address, "channel": cid,
            "authkey": authkey.hex(), "run": run_module.run_id(), "argv": sys.argv,
            "cwd": os.getcwd(), "since": _started_wall, "job": run_module.is_job(),
            "fiber": __version__}
    final = os.path.join(path, f"{pid}-{started}.json")
    return final if try_write_record(final, data, "the status registration") else None


def _unregister() -> None:
    global _registered
    path, _registered = _registered, None
    if path is not None and _registered_pid == os.getpid():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _worker(ws: Any) -> dict[str, Any]:
    process = ws.process
    fields = {"id": ws.id, "state": ws.state, "held": ws.held,
              "dispatched": ws.dispatched, "job_id": None, "host": None, "pid": None,
              # tasks it finished (sent to it and no longer held)
              "done": max(0, ws.dispatched - ws.held),
              "since": round(getattr(ws, "since", 0.0), 3),
              "placement": getattr(ws, "placement", "")}
    if process is not None:
        for name in ("job_id", "host"):
            try:
                fields[name] = getattr(process, name)
            except (AttributeError, ValueError):
                pass
        # as known now: Process.pid waits until the job runs (a queued job has none)
        fields["pid"] = getattr(getattr(process, "_popen", None), "pid", None)
    if (ws.state == "starting" and fields["job_id"] is not None
            and monitor.last_state(fields["job_id"]) is JobState.PENDING):
        fields["state"] = "pending"  # queued by the cluster
    return fields


def pool_status(pool_id: int, stats: Any) -> dict[str, Any]:
    """One pool's part of a snapshot, from its :class:`~fiber.pool.PoolStats`."""
    running = stats.idle + stats.busy
    return {
        "id": pool_id,
        "state": stats.state,
        "processes": stats.processes,
        "workers": {
            "pending": stats.pending, "starting": stats.starting - stats.pending,
            "running": running, "idle": stats.idle, "busy": stats.busy,
            "stopping": stats.stopping, "lost": stats.lost, "replaced": stats.replaced,
            "started": stats.started,
        },
        "tasks": {"queued": stats.queued, "running": stats.running, "held": stats.held,
                  "done": stats.done, "failed": stats.failed},
        "throughput": round(stats.throughput, 3),
        "task_seconds": (None if stats.task_seconds is None
                         else round(stats.task_seconds, 3)),
        "slowest": [dataclasses.asdict(t) for t in stats.slowest],
        "errors": [dataclasses.asdict(e) for e in stats.errors],
        "worker_list": [_worker(ws) for ws in stats.workers],
        # an adaptive pool's settings, wanted size and last decisions (Pool.adapt)
        "adapt": None if getattr(stats, "adapt", None) is None
        else dataclasses.asdict(stats.adapt),
        # task times per function (histograms) and the last lost workers
        "functions": [dataclasses.asdict(f) for f in getattr(stats, "functions", ())],
        "lost_list": [{"time": lw.time, "worker": lw.worker, "job_id": lw.job_id,
                       "host": lw.host} for lw in getattr(stats, "recently_lost", ())],
    }


LOG_TAIL_BYTES = 16 * 1024  # the end of a job's log that a LOG request returns
LOG_TAIL_LINES = 100


def worker_log(pool_id: int, wid: int) -> dict[str, Any]:
    """The tail of the log that the backend keeps of worker ``wid``'s job, of the pool
    ``pool_id`` (live, or among its recently lost workers, whose log's tail was kept
    as their job ended: ``kept_log`` of :mod:`fiber.runtime.popen`): ``log`` is None
    when the worker is not known, "" when the backend keeps no log of the job."""
    with _lock:
        pool = _pools.get(pool_id)
    found: dict[str, Any] = {"pool": pool_id, "worker": wid, "job_id": None, "log": None}
    if pool is None:
        return found
    stats = pool.stats()
    process = next((w.process for w in stats.workers if w.id == wid), None)
    if process is None:
        process = next((lw.process for lw in reversed(stats.recently_lost)
                        if lw.worker == wid), None)
    popen = getattr(process, "_popen", None)
    job = getattr(process, "job", None)
    backend = getattr(popen, "backend", None)
    if job is None or backend is None:
        return found
    found["job_id"] = job.id
    # a job that failed by itself (a lost worker's) was released once it ended, which
    # freed its log: its tail was kept then
    kept = getattr(popen, "kept_log", None)
    text = (kept if kept is not None else backend.logs(job))[-LOG_TAIL_BYTES:]
    found["log"] = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    return found


def snapshot() -> dict[str, Any]:
    """This program and its pools, as ``fiber top --once --json`` prints them."""
    with _lock:
        pools = sorted(_pools.items())
    return {
        "program": {"pid": os.getpid(), "argv": sys.argv, "run": run_module.run_id(),
                    "backend": config.get_config().backend, "since": _started_wall,
                    "fiber": __version__},
        "time": time.time(),
        "pools": [pool_status(pid, pool.stats()) for pid, pool in pools],
    }


# -- the reading side -----------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """A running program's registration."""

    pid: int
    started: int
    address: str
    channel: int
    authkey: str
    run: str
    argv: list[str]
    since: float
    path: str

    def alive(self) -> bool:
        return start_time(self.pid) == self.started


def _program_of(file: str, data: dict[str, Any]) -> Program:
    return Program(int(data["pid"]), int(data["started"]), str(data["address"]),
                   int(data["channel"]), str(data["authkey"]), str(data["run"]),
                   [str(a) for a in data["argv"]], float(data["since"]), file)


def query_log(program: Program, pool_id: int, wid: int,
              timeout: float = 10.0) -> dict[str, Any]:
    """The tail of a worker's job log (:func:`worker_log`), asked of ``program``."""
    request = StatusOp.LOG + json.dumps({"pool": pool_id, "worker": wid}).encode()
    return query(program, timeout, request=request)


def programs() -> Iterator[Program]:
    """The registered programs of this user that are still running, newest first;
    registrations of processes that are gone are deleted. Raises
    :class:`~fiber.errors.NotPrivateError` when the directory is not private to the
    user (nothing found there could be trusted)."""
    path = _private_directory(create=False)
    if path is None:
        return iter(())
    found = []
    for program in read_records(path, _program_of, "registration"):
        if program.alive():
            found.append(program)
        else:
            try:
                os.unlink(program.path)  # its program is gone (killed: it never removed it)
            except FileNotFoundError:
                pass
    found.sort(key=lambda p: -p.since)
    return iter(found)


def query(program: Program, timeout: float = 10.0,
          authkey: bytes | None = None, request: bytes = StatusOp.SNAPSHOT) -> dict[str, Any]:
    """Ask ``program`` for its snapshot (or another ``request`` of
    :class:`~fiber.wire.protocol.StatusOp`) over its hub (authenticated with the secret
    of its registration, or ``authkey``). Raises :class:`fiber.ConnectionLostError` when
    it cannot be reached, :class:`fiber.AuthenticationError` when the secret is wrong."""
    client = transport.Client(program.address, authkey or bytes.fromhex(program.authkey))
    try:
        reply = client.request(program.channel, request, timeout=timeout)
    finally:
        client.close()
    result: dict[str, Any] = json.loads(bytes(reply).decode())
    return result
