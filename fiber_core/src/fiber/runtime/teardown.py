"""Ending groups of jobs: in bulk, bounded in time, retried while the cluster does
not answer, and said at exit when some could not be ended.

A pool that is terminated, or a program that exits, ends its jobs through
:func:`end_jobs`: one :meth:`Backend.terminate_jobs` call per backend (one ``scancel``
of many ids on Slurm; concurrent calls elsewhere), made in a thread of its own, and
waited for at most :data:`END_WAIT` seconds. A cluster manager that is down for a
while therefore does not hold the caller: the call goes on in its thread, and the jobs
whose end it could not ask for are handed to the *reaper*, a thread that asks again,
backing off from :data:`RETRY_FIRST` to :data:`RETRY_LONGEST` seconds, until each job
has ended (its final status came) or the program exits. At exit,
:func:`report_at_exit` makes one last bounded attempt and logs a warning that lists
the jobs it could not end, with the command that ends them later (``fiber clean``).

The processes of a pool, or the daemonic children of an exiting program, are ended
together by :func:`end_processes` and :func:`end_and_wait` (SIGTERM, a bounded wait,
then SIGKILL), through the public methods of their
:class:`~fiber.runtime.popen.JobPopen` (:class:`JobHandle`). A job whose cluster
resources (a container, a pod, a log file) are not freed yet is *held* here
(:func:`hold`, :func:`released`) until its backend has freed it; at exit
:func:`release_all` waits a little for those, then ends and frees the rest.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from fiber import threads as fiber_threads
from fiber.backend import Backend
from fiber.backend.job import Job
from fiber.errors import ClusterUnreachableError
from fiber.runtime.monitor import in_outage, note_unreachable

logger = logging.getLogger("fiber")

#: seconds :func:`end_jobs` waits for the cluster before it returns
END_WAIT = 3.0
#: the reaper's first and longest pause between two tries, seconds
RETRY_FIRST = 1.0
RETRY_LONGEST = 15.0

__all__ = ["END_WAIT", "RELEASE_AT_EXIT_TIMEOUT", "Endable", "JobHandle", "end_and_wait",
           "end_jobs", "end_processes", "hold", "left_running", "pending", "release_all",
           "released", "report_at_exit"]


class Endable(Protocol):
    """What :func:`end_jobs` ends: a job and whether its end is known (a JobPopen)."""

    job: Job
    backend: Backend

    def has_ended(self) -> bool: ...


def _by_backend(items: Iterable[Endable]) -> dict[int, tuple[Backend, list[Endable]]]:
    groups: dict[int, tuple[Backend, list[Endable]]] = {}
    for item in items:
        groups.setdefault(id(item.backend), (item.backend, []))[1].append(item)
    return groups


def _call(backend: Backend, items: Sequence[Endable], force: bool) -> list[Endable]:
    """One ``terminate_jobs`` call; the items it could not end (all, if it raised)."""
    _reaper.begin(items, force)
    try:
        errors = backend.terminate_jobs([item.job for item in items], force)
    except Exception as exc:  # noqa: BLE001 - the cluster may not answer now
        logger.debug("ending %d %s jobs failed", len(items), backend.name, exc_info=True)
        errors = {item.job.id: exc for item in items}
    if any(isinstance(error, ClusterUnreachableError) for error in errors.values()):
        note_unreachable(backend)
    failed = [item for item in items if item.job.id in errors]
    if failed:
        _reaper.add(failed, force, errors[failed[0].job.id])
    _reaper.finish(items)
    return failed


def end_jobs(items: Iterable[Endable], force: bool = False,
             wait: float = END_WAIT) -> None:
    """Ask every backend to end the jobs of ``items`` that have not ended, in one
    call per backend, and wait for those calls at most ``wait`` seconds; what they
    could not end is retried in the background."""
    live = [item for item in items if not item.has_ended()]
    if not live:
        return
    threads = []
    for backend, group in _by_backend(live).values():
        # (its jobs would stay unended: the reaper asks again for them)
        thread = fiber_threads.start(
            "fiber-end", _call, backend, group, force, name=f"fiber-end-{backend.name}",
            fails=functools.partial(_end_call_died, group, force))
        threads.append(thread)
    deadline = time.monotonic() + wait
    while True:
        calls = [thread for thread in threads if thread.is_alive()]
        # jobs told to end over their own connection (a connected process) may be
        # known to have ended before the cluster manager answers
        if not calls or all(item.has_ended() or in_outage(item.backend) for item in live):
            return  # (a cluster that does not answer now: the reaper asks again)
        left = deadline - time.monotonic()
        if left <= 0:
            return
        calls[0].join(min(left, 0.05))


def _end_call_died(group: list[Endable], force: bool, error: BaseException) -> None:
    _reaper.add(group, force, error)


class _Reaper:
    """Asks again to end the jobs whose end could not be asked for."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: dict[int, tuple[Endable, bool]] = {}  # id(item) -> (item, force)
        # items whose end is being asked for now (a call that may hang in an outage)
        self._inflight: dict[int, tuple[Endable, bool]] = {}
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def add(self, items: Sequence[Endable], force: bool, error: BaseException) -> None:
        with self._cond:
            self._error = error
            if self._stopped:  # the program is exiting: report_at_exit says what is left
                return
            first = not self._items
            for item in items:
                old = self._items.get(id(item))
                self._items[id(item)] = (item, force or (old is not None and old[1]))
            self._error = error
            if first:
                logger.warning(
                    "could not end %d %s jobs now (%s: %s); fiber asks again in the "
                    "background until they end", len(items), items[0].backend.name,
                    type(error).__name__, error)
            if self._thread is None:
                self._thread = fiber_threads.start("fiber-reaper", self._run,
                                                   fails=self._died)
            self._cond.notify_all()

    def _died(self, error: BaseException) -> None:
        """The reaper's thread died: its jobs are named at exit with ``error``
        (report_at_exit), and the next add() starts a new thread."""
        with self._cond:
            self._error = error
            self._thread = None

    def begin(self, items: Sequence[Endable], force: bool) -> None:
        with self._cond:
            for item in items:
                self._inflight[id(item)] = (item, force)

    def finish(self, items: Sequence[Endable]) -> None:
        with self._cond:
            for item in items:
                self._inflight.pop(id(item), None)

    def pending(self) -> list[Endable]:
        with self._cond:
            return [item for item, _ in self._items.values() if not item.has_ended()]

    def _take(self) -> list[tuple[Endable, bool]]:
        with self._cond:
            for key, (item, _) in list(self._items.items()):
                if item.has_ended():
                    del self._items[key]
            taken = list(self._items.values())
            self._items.clear()
            return taken

    def _run(self) -> None:
        pause = RETRY_FIRST
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or bool(self._items))
                if self._stopped:
                    return
                self._cond.wait_for(lambda: self._stopped, timeout=pause)
                if self._stopped:
                    return
            taken = self._take()
            failed: list[Endable] = []
            for force in (False, True):
                chosen = [item for item, f in taken if f == force]
                for backend, group in _by_backend(chosen).values():
                    failed += _call(backend, group, force)
            if failed:
                pause = min(pause * 2, RETRY_LONGEST)
            else:
                pause = RETRY_FIRST
                if taken:
                    logger.info("ended %d jobs that the cluster could not end before",
                                len(taken))

    def stop(self) -> list[tuple[Endable, bool]]:
        """Stop asking; what is left (not ended)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            left = {key: entry for key, entry in
                    (*self._inflight.items(), *self._items.items())
                    if not entry[0].has_ended()}
            self._items.clear()
            return list(left.values())

    @property
    def error(self) -> BaseException | None:
        return self._error


_reaper = _Reaper()


_left_at_exit: list[str] = []  # ids of the jobs report_at_exit could not end


def left_running() -> bool:
    """Whether jobs of this process may be left running: the reaper still holds some,
    or the exit's last try could not end them (then the run's record stays, so that
    ``fiber clean`` knows them as orphans: :mod:`fiber.runtime.runs`)."""
    return bool(_left_at_exit) or bool(_reaper.pending())


def pending() -> list[Endable]:
    """The jobs the reaper still tries to end."""
    return _reaper.pending()


def report_at_exit(wait: float = END_WAIT) -> None:
    """At exit: ask once more (at most ``wait`` seconds) to end what the reaper holds,
    and log a warning listing the jobs that could still not be ended."""
    left = _reaper.stop()
    if not left:
        return
    confirmed: set[int] = set()  # ids of items whose last call ended them

    def last_try(backend: Backend, group: list[Endable], force: bool) -> None:
        try:
            errors = backend.terminate_jobs([item.job for item in group], force)
        except Exception:  # noqa: BLE001 - reported below
            return
        confirmed.update(id(item) for item in group if item.job.id not in errors)

    threads = []
    for force in (False, True):
        chosen = [item for item, f in left if f == force]
        for backend, group in _by_backend(chosen).values():
            thread = fiber_threads.start(
                "fiber-end-at-exit", last_try, backend, group, force,
                exempt="its jobs, not confirmed ended, are named in the warning below")
            threads.append(thread)
    deadline = time.monotonic() + wait
    for thread in threads:
        while thread.is_alive() and time.monotonic() < deadline and not all(
                in_outage(item.backend) for item, _ in left):
            thread.join(min(0.05, max(0.0, deadline - time.monotonic())))
    still = [item for item, _ in left if id(item) not in confirmed and not item.has_ended()]
    _left_at_exit.extend(item.job.id for item in still)
    error = _reaper.error
    why = f"{type(error).__name__}: {error}" if error is not None else \
        "its cluster manager does not answer"
    for backend, group in _by_backend(still).values():
        logger.warning(
            "%d %s jobs of this run may still be running: the cluster did not confirm "
            "their end (%s): %s. `fiber clean` (with FIBER_BACKEND=%s) ends them once "
            "the cluster answers.", len(group), backend.name, why,
            ", ".join(item.job.id for item in group), backend.name)


# -- the processes of a program ---------------------------------------------------------
class JobHandle(Endable, Protocol):
    """A started process's job as the group ending uses it: a JobPopen's public
    methods."""

    @property
    def is_connected(self) -> bool: ...

    def has_job(self) -> bool: ...

    def mark_ending(self) -> None: ...

    def tell_to_end(self, force: bool) -> None: ...

    def wait(self, timeout: float | None = None) -> int | None: ...

    def release(self) -> None: ...


# Jobs whose cluster resources (a container, a pod, a log file) are not freed yet: a
# job is freed once the backend reports its final status, which may come after the
# process was joined. At exit, fiber waits a little for those, then frees the rest.
_unreleased: set[JobHandle] = set()
_unreleased_lock = threading.Condition()
#: seconds :func:`release_all` waits for the backends to free the jobs at exit
RELEASE_AT_EXIT_TIMEOUT = 10.0


def hold(job: JobHandle) -> None:
    """``job`` was created: its cluster resources are to be freed (:func:`released`)."""
    with _unreleased_lock:
        _unreleased.add(job)


def released(job: JobHandle) -> None:
    """``job``'s backend was asked to free it."""
    with _unreleased_lock:
        _unreleased.discard(job)
        _unreleased_lock.notify_all()


def _job_of(proc: Any) -> JobHandle | None:
    """The job of a started process (its JobPopen), or None: not started, or not a
    job (a test's stand-in)."""
    p = getattr(proc, "_popen", None)
    return p if callable(getattr(p, "tell_to_end", None)) else None


def end_processes(processes: Iterable[Any], force: bool = False,
                  wait: float = END_WAIT) -> None:
    """End the jobs of many started processes at once (a pool's workers): one
    :meth:`Backend.terminate_jobs` call per backend, waited for at most ``wait``
    seconds; a cluster that does not answer is asked again in the background."""
    handles = []
    for proc in processes:
        p = _job_of(proc)
        if p is not None:
            if p.has_job() and not p.has_ended():
                p.tell_to_end(force)
                handles.append(p)
            continue
        try:  # not a job (a test's stand-in): its own methods
            proc.kill() if force else proc.terminate()
        except Exception:  # noqa: BLE001 - not started, or already gone
            pass
    end_jobs(handles, force, wait)


def _running(proc: Any) -> bool:
    p = _job_of(proc)
    if p is not None:
        return not p.has_ended()
    try:
        return proc.exitcode is None
    except Exception:  # noqa: BLE001 - never started, or closed
        return False


def _may_end_soon(proc: Any) -> bool:
    """Whether waiting for ``proc`` can help: it is connected (told to end over its
    own connection), or its cluster manager answers."""
    p = _job_of(proc)
    return p is None or p.is_connected or not in_outage(p.backend)


def end_and_wait(processes: Iterable[Any], wait: float) -> list[Any]:
    """End ``processes`` (SIGTERM-like), wait up to ``wait`` seconds for them, force
    the end of those still running and wait as long again; the ones still running
    (their cluster does not answer: the reaper keeps trying). The waits stop early
    when nothing left can end (not connected, cluster down)."""
    left = [proc for proc in processes if _running(proc)]
    for force in (False, True):
        if not left:
            break
        end_processes(left, force=force)
        deadline = time.monotonic() + wait
        while True:
            left = [proc for proc in left if _running(proc)]
            waiting = [proc for proc in left if _may_end_soon(proc)]
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            p = _job_of(waiting[0])
            if p is not None:
                p.wait(min(0.05, remaining))
            else:
                time.sleep(min(0.05, remaining))
    return left


def release_all(timeout: float = RELEASE_AT_EXIT_TIMEOUT) -> None:
    """Wait up to ``timeout`` seconds for every job of this process to be freed by its
    backend (not while the backend's cluster does not answer), then end and free
    those that are left (so an exiting program leaves no container, pod or job
    behind), and say which jobs could not be ended."""
    deadline = time.monotonic() + timeout
    with _unreleased_lock:
        while _unreleased and time.monotonic() < deadline:
            if all(in_outage(p.backend) for p in _unreleased):
                break  # no final status comes while the cluster does not answer
            _unreleased_lock.wait(min(0.5, deadline - time.monotonic()))
        left = list(_unreleased)
    if left:
        for p in left:
            logger.debug("ending job %s at exit (no final status yet)", p.job.id)
            p.mark_ending()
        end_jobs(left, force=True)
        _release_many(left, END_WAIT)
    report_at_exit()
    # (each wait above stops early for a backend whose cluster does not answer)


def _release_many(handles: list[JobHandle], wait: float) -> None:
    """Free ``handles``' jobs concurrently, waiting at most ``wait`` seconds (a
    cluster that does not answer holds a daemon thread, not the exit)."""
    threads = [fiber_threads.start(
        "fiber-release", p.release,
        exempt="at exit, after the job was told to end; report_at_exit names what is left")
        for p in handles]
    deadline = time.monotonic() + wait
    for thread, p in zip(threads, handles, strict=True):
        while thread.is_alive() and not in_outage(p.backend):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            thread.join(min(0.05, remaining))
