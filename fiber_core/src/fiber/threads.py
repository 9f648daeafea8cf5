"""Every thread fiber starts, started by :func:`start`: named, its death recorded, and
what depends on it failed with the cause.

A thread that ends with an uncaught exception is logged once (its name and the
traceback, on the ``fiber`` logger, ERROR) and recorded (:func:`deaths`); then the
``fails`` callback its starter gave is called, in the dying thread, with a
:class:`~fiber.errors.FiberThreadError` naming the thread and carrying the exception as
``__cause__``. That callback wakes whoever waits on the thread (a pool's result, a
queue's ``get``, a status request) with the error, and makes later calls raise it. A
thread whose death only costs itself (it serves one short job whose failure is
reported another way) is started with ``exempt="why"`` instead: logged and recorded,
nothing else. In a job, a thread without which the job cannot go on fails it with
:func:`end_process`: the job writes one line to its stderr and exits with
:data:`THREAD_DIED_EXIT`, which its parent sees at once as a lost process.

Every kind of thread is declared in :data:`KINDS` (a thread's name is its kind, or
starts with it and a dash: ``fiber-monitor-slurm``); ``tests/core/test_thread_death.py``
kills each kind and checks that the call depending on it raises, so a new kind needs
a test there.

**Fault injection for tests.** When the environment variable
:data:`FAULT_ENV` (a job of the local backend inherits it) names a kind (a comma-separated list), each
thread of that kind raises ``RuntimeError`` as its first act, before its target runs.
Read once per thread start: threads start rarely, and nothing per message is wrapped.

**Ordering for tests.** :func:`hold` makes the threads of one kind that this process
starts wait, before their target runs, until the test releases them: a test that needs
a thread to act *after* something (an SSH job's reader to read the job's pid only after
the job was terminated) forces that order instead of hoping a timing gives it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator

from fiber import util
from fiber.errors import FiberThreadError

__all__ = ["FAULT_ENV", "KINDS", "THREAD_DIED_EXIT", "deaths", "end_process", "guarded",
           "hold", "start"]

logger = logging.getLogger("fiber")

#: names kinds of thread that raise at once when started (tests only, see the module)
FAULT_ENV = "_FIBER_TEST_THREAD_FAULT"

#: the exit code of a job ended by :func:`end_process` (70 is a job whose parent is gone)
THREAD_DIED_EXIT = 71

#: every kind of thread fiber starts: name (or name prefix) -> what it does
KINDS: dict[str, str] = {
    # the parent's runtime
    "fiber-monitor": "polls a backend for the statuses of its jobs",
    "fiber-pool-supervisor": "keeps a pool at its size (starts its workers)",
    "fiber-pool-adapt": "sizes an adaptive pool (Pool.adapt): starts and gives back workers",
    "fiber-pool-feeder": "reads an imap's input and submits it",
    "fiber-progress": "draws a map's progress bar",
    "fiber-journal": "commits a durable pool's results to its journal",
    "fiber-end": "asks a backend to end jobs",
    "fiber-end-at-exit": "asks a backend a last time to end jobs, at exit",
    "fiber-reaper": "asks again to end the jobs whose end failed",
    "fiber-release": "frees a job's resources at exit",
    "fiber-status": "answers one `fiber top` request",
    "fiber-stdlib-queue": "feeds a multiprocessing.Queue's items to the jobs given it",
    "fiber-conn-watch": "watches the readiness of a queue or pipe owned elsewhere",
    "fiber-fork-holds": "frees what a forked child held once it exits",
    "fiber-call": "one of the threads making a backend's calls in parallel",
    "fiber-forkserver": "reads the local backend's template process",
    "fiber-timers": "runs the hub's deadlines (timeouts, heartbeat checks)",
    "fiber-nng-close": "closes an nng connection whose peer went away",
    "fiber-gate": "admits a listener's new connections through their handshakes",
    "fiber-hub": "receives every message of a hub's nng socket",
    "fiber-pipe-close": "closes an nng connection the hub refused, evicted or timed out",
    "fiber-stream": "reads a hub's stream connections (the stream listener's selector)",
    "fiber-pool-lines": "handles the pool lines the stream listener could not wait for "
                        "(the pool's lock was busy)",
    "fiber-pool-start": "starts one pool worker's job (a starter pool's task)",
    "fiber-manager-line": "serves one connection to a manager's server",
    "fiber-shared-server": "accepts the connections to a process's shared objects",
    "fiber-shared-line": "serves one connection to a process's shared objects",
    # the `fiber dashboard` command (a process of its own, not the program's)
    "fiber-dashboard-http": "serves the dashboard's page, its events and its API",
    "fiber-dashboard-feed": "asks the watched program for its status while a page is open",
    # a job's runtime
    "fiber-heartbeat": "a job's heartbeat with its parent",
    "fiber-output": "sends a job's stdout or stderr to its parent",
    "fiber-pool-results": "sends a pool worker's results",
    "fiber-pool-give": "serves a pool worker's give line (recalls of queued tasks)",
    # plugins (they start threads through fiber.backend.start_thread)
    "fiber-k8s-watch": "watches the pods of a Kubernetes run",
    "fiber-ssh-prepare": "prepares one SSH host",
    "fiber-ssh-reader": "reads the output of one SSH job",
    "fiber-ssh-dispatch": "starts queued SSH jobs as hosts free up",
    "fiber-ssh-kill": "ends one SSH job",
    "fiber-ssh-search": "looks for a job on one SSH host",
}

_deaths: collections.deque[tuple[str, BaseException]] = collections.deque(maxlen=100)

#: kind -> the gate its threads wait at before their target (tests only: :func:`hold`)
_held: dict[str, threading.Event] = {}


def deaths() -> list[tuple[str, BaseException]]:
    """The last 100 fiber threads of this process that died: (name, exception)."""
    return list(_deaths)


@contextlib.contextmanager
def hold(kind: str) -> Iterator[threading.Event]:
    """Tests only: every thread of ``kind`` started in this process inside the block
    waits, before its target runs, until the event yielded is set; leaving the block
    sets it (no thread is held past the block)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of fiber thread {kind!r}")
    gate = threading.Event()
    _held[kind] = gate
    try:
        yield gate
    finally:
        if _held.get(kind) is gate:
            del _held[kind]
        gate.set()


def start(kind: str, target: Callable[..., object], *args: object, name: str | None = None,
          fails: Callable[[FiberThreadError], object] | None = None,
          exempt: str | None = None, daemon: bool = True,
          started: bool = True) -> threading.Thread:
    """Start ``target(*args)`` on a thread named ``name`` (default ``kind``), which must
    be :data:`KINDS`'s ``kind`` or begin with ``kind + "-"``. Exactly one of ``fails``
    (called with the error if the thread dies, see the module) and ``exempt`` (why
    nothing depends on the thread) is given. Returns the thread, started unless
    ``started`` is False (then the caller starts it)."""
    name = _check(kind, name, fails, exempt)
    inject = kind in os.environ.get(FAULT_ENV, "").split(",")
    thread = threading.Thread(target=_run,
                              args=(name, target, args, fails, inject, _held.get(kind)),
                              name=name, daemon=daemon)
    if started:
        thread.start()
    return thread


def guarded(kind: str, target: Callable[..., object], *, name: str | None = None,
            fails: Callable[[FiberThreadError], object] | None = None,
            exempt: str | None = None) -> Callable[..., None]:
    """``target`` wrapped to run on a thread fiber does not start itself (a task of a
    :class:`concurrent.futures.ThreadPoolExecutor`): each call is what :func:`start`'s
    thread would be (fault injection, its death logged, recorded and ``fails``
    called), so that nothing it raises is left unread in a future."""
    name = _check(kind, name, fails, exempt)

    def call(*args: object) -> None:
        inject = kind in os.environ.get(FAULT_ENV, "").split(",")
        _run(name, target, args, fails, inject, _held.get(kind))

    return call


def _check(kind: str, name: str | None, fails: object, exempt: object) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown kind of fiber thread {kind!r}: declare it in "
                         "fiber.threads.KINDS (and test its death)")
    name = kind if name is None else name
    if name != kind and not name.startswith(kind + "-"):
        raise ValueError(f"thread name {name!r} does not start with its kind {kind!r}")
    if (fails is None) == (exempt is None):
        raise TypeError("start() needs exactly one of fails= and exempt=")
    return name


def _run(name: str, target: Callable[..., object], args: tuple[object, ...],
         fails: Callable[[FiberThreadError], object] | None, inject: bool,
         gate: threading.Event | None = None) -> None:
    if gate is not None:
        gate.wait()  # (tests only: hold())
    try:
        if inject:
            raise RuntimeError(f"injected into {name} by {FAULT_ENV}")
        target(*args)
    except BaseException as exc:  # noqa: BLE001 - recorded, logged, and what depends on it fails
        _died(name, exc, fails)


def _died(name: str, exc: BaseException,
          fails: Callable[[FiberThreadError], object] | None) -> None:
    _deaths.append((name, exc))
    logger.error("fiber thread %s died: %s: %s", name, type(exc).__name__, exc,
                 exc_info=(type(exc), exc, exc.__traceback__))
    if fails is None:
        return
    error = FiberThreadError(f"fiber thread {name!r} died: {type(exc).__name__}: {exc}",
                             thread=name)
    error.__cause__ = exc
    try:
        fails(error)
    except BaseException:  # noqa: BLE001 - nothing else can report it
        logger.exception("failing what depends on fiber thread %s failed", name)


def end_process(error: FiberThreadError) -> None:
    """The ``fails`` of a job's thread that the job cannot go on without: one line on
    the job's stderr (its log), then exit with :data:`THREAD_DIED_EXIT`, so that its
    parent sees a lost process at once rather than a silent one."""
    util.exit_now(f"fiber: {error}; this job exits", THREAD_DIED_EXIT)
