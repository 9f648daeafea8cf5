"""The worker set of a pool: starting workers, keeping the pool at its size, letting
workers go, and ending them.

Workers are job-backed processes (fiber Processes, made by the ``make_process`` the
pool passes in) started on a thread pool, the *starter*, since a cluster backend may
take seconds per job: up to ``STARTER_THREADS`` jobs are created at once (threads are
made only as starts wait, so a small pool makes few): a pool of a thousand workers on a
cluster whose API takes a second per job starts in half a minute, not two (8 threads).
More would not help the local backend, whose template forks one job at a time (a
thousand local workers started in 14-19 s with 8, 32 or 128 on this loaded machine),
and would only lengthen the wait of each start for its answer. A *supervisor* thread keeps the number of live workers at the
pool's target size: it asks the pending table (:mod:`~fiber.runtime.pool.scheduler`)
for the records of the missing workers (they count as *starting* until they connect)
and hands them to the starter. It holds the worker set only weakly between rounds, so
an unreferenced pool can be garbage collected, which ends its workers.

A pool's ``workers_per_job`` (1 by default) groups the workers the supervisor starts
together into jobs of that many (:func:`~fiber.runtime.pool.worker.worker_group`):
each worker still connects and is counted on its own, and is lost on its own when its
connection drops; when a job ends, every worker it ran is lost.

A worker whose job ends is lost to the table (its tasks are requeued) and replaced.
One that fails on its own before it ever connected (a traceback while it prepares,
another fiber version, an exit status or a crash) counts as a start failure; one that
was killed from outside (a signal such as SIGKILL or SIGTERM: a user, an OOM killer, the
local backend's template dying) does not, however early it dies. ``START_FAILURES_LIMIT``
start failures in a row, or a ``start()`` that raises, *break* the pool: every waiting
result fails with that error (the last failed worker's own), new submissions raise
it, and the workers that did start are ended (a pool whose second worker's start
raises does not keep the first). ``start()`` itself rides out the backend's transient errors
(:mod:`fiber.runtime.retry`), so only a permanent error, or one that outlasted the retry
budget, breaks the pool; a retry stops early when the pool is terminated.

Ending: ``terminate()`` ends every worker, including those whose start is under way
(each is ended by its starter thread once its job exists), and returns once all of
them are gone, as multiprocessing's does. ``join()`` after ``close()`` waits for the
supervisor to see the last result out, then for every worker to exit.

Placements (an adaptive pool over several contexts, :meth:`fiber.Pool.adapt`): the set
has a list of :class:`Placement` (the first, until ``adapt`` names others, is the
pool's own context); each worker is started in one (``placement_of``, chosen by the
driver through ``to_place``), by its ``make_process``, on its backend, and connects to
the pool's channel on its hub. While a driver listens (``on_failure``), a start that
raises, or a job that ends on its own before its workers connect, is reported to it
(the placement is skipped for a while) instead of breaking the pool, and a start does
not wait out the backend's transient errors (the other placements are there).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from fiber import threads, util
from fiber.backend import Backend
from fiber.errors import ProcessStartError
from fiber.runtime import retry, run, submit, teardown
from fiber.runtime.pool.ending import WorkerProcess, end_pool, terminate_workers
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.tasks import CLOSE, RUN, TERMINATE, Worker, settle
from fiber.wire import transport

logger = logging.getLogger("fiber")

START_FAILURES_LIMIT = 3
STARTER_THREADS = 32  # job creations under way at once, at most
#: the worker set's list of processes is rid of the ended ones when it reaches this
#: length, then each time it has doubled (amortised O(1) per start)
PRUNE_AT = 64


@dataclass(frozen=True)
class Placement:
    """A context a pool's workers may come from: ``make_process(worker_ids)`` makes a
    job's process there, on ``backend``; its workers reach the pool's channel ``cid``
    on ``hub``. ``name`` shows it (stats, logs)."""

    name: str
    make_process: Callable[[list[int]], WorkerProcess]
    backend: Backend
    hub: transport.Hub
    cid: int


class WorkerSet:
    """The workers of one pool. ``make_process(worker_ids)`` returns the unstarted
    process of a job that runs those workers (``workers_per_job`` of them at most, one
    by default); ``changed`` is the condition, on the pool's lock, that the table
    notifies; the workers are ended when ``owner`` (the pool) is garbage collected."""

    def __init__(self, owner: object, scheduler: Scheduler, changed: threading.Condition,
                 make_process: Callable[[list[int]], WorkerProcess], hub: transport.Hub,
                 cid: int, backend: Backend | None = None, workers_per_job: int = 1,
                 ) -> None:
        self._per_job = workers_per_job
        # the backend the workers' jobs go to (the pool's context's; else the run's)
        self._backend = backend if backend is not None else run.backend()
        self._scheduler = scheduler
        self._changed = changed
        self._make_process = make_process
        self._cid = cid
        self._hub = hub
        self.processes: list[WorkerProcess] = []  # every worker started, until joined
        self._prune_at = PRUNE_AT  # its length at which the ended ones are dropped
        # where workers may be started (see the module); the pool's channels on hubs
        # other than its own (removed with it)
        self.placements = [Placement("pool", make_process, self._backend, hub, cid)]
        self.channels: list[tuple[transport.Hub, int]] = []
        self.placement_of: dict[int, int] = {}  # worker id -> index in placements
        self.to_place: list[int] = []  # the placements of the next workers started
        self.start_began: dict[int, float] = {}  # worker id -> its start, until a job
        # the adaptive driver's: (placement, why) when a start there failed (the lock
        # is held); None: a failed start counts towards breaking the pool
        self.on_failure: Callable[[int, str], None] | None = None
        # the adaptive driver's: the placement of a worker started without its decision
        # (a replacement after maxtasksperchild), given the workers each placement
        # holds (the lock is held); None: the first placement
        self.place_next: Callable[[list[int]], int] | None = None
        # as multiprocessing's pools: ended at exit before the process ends its children
        self.finalizer = util.Finalize(owner, end_pool,
                                       (scheduler, changed, self.processes, hub, cid,
                                        self.channels),
                                       exitpriority=15)
        # (a bulk backend: a whole group reaches one create_jobs call, runtime.submit)
        # An executor rather than threads.start per worker: a bounded set of threads
        # fed by a queue, which terminate() cancels and waits for in one call; each of
        # its tasks runs through threads.guarded, so what a start raises is never left
        # unread in a future (it breaks the pool: _start_died)
        self._starter = ThreadPoolExecutor(max_workers=submit.starter_threads(
                                               self._backend, STARTER_THREADS),
                                           thread_name_prefix="fiber-pool-start")
        ref = weakref.ref(self)
        self._supervisor = threads.start("fiber-pool-supervisor", WorkerSet._supervise,
                                         ref, changed,
                                         fails=lambda error: WorkerSet._supervisor_died(ref, error))

    # -- keeping the size -----------------------------------------------------------
    @staticmethod
    def _supervise(ref: weakref.ref[WorkerSet], changed: threading.Condition) -> None:
        """Keep the pool at its size. Holds the set only weakly between rounds."""
        while True:
            workers = ref()
            if workers is None:
                return
            with changed:
                plan = workers._plan()
                if plan is None:
                    return
                if not plan:
                    workers._scheduler.recall_late()  # a holder passed over may be late
                    del workers
                    changed.wait(1.0)
                    continue
            n = workers._per_job
            by_placement: dict[int, list[Worker]] = {}
            for w in plan:
                by_placement.setdefault(workers.placement_of.get(w.id, 0), []).append(w)
            for index, group in by_placement.items():
                jobs = [group[i:i + n] for i in range(0, len(group), n)]
                # one create_jobs call for the group
                submit.expect(workers.placement(index).backend, len(jobs))
                for job in jobs:
                    try:
                        workers._starter.submit(threads.guarded(
                            "fiber-pool-start", workers._start,
                            fails=functools.partial(workers._start_died, job)), job)
                    except RuntimeError:  # terminated meanwhile
                        return
            del workers

    @staticmethod
    def _supervisor_died(ref: weakref.ref[WorkerSet], error: BaseException) -> None:
        """No worker will be started or replaced: the pool is broken (its queued
        tasks and later calls fail with ``error``)."""
        workers = ref()
        if workers is not None:
            workers._break(error)

    def _plan(self) -> list[Worker] | None:
        """Workers to start now ([] for none), or None when supervising is over.
        Called with the lock held."""
        s = self._scheduler
        if s.state == TERMINATE or not self.finalizer.still_active():
            return None  # terminated, or the pool was collected during a start
        live = sum(1 for w in s.workers.values() if w.alive and not w.stopping)
        need = s.target - live
        if s.state == CLOSE and not s.unfinished():
            if not any(w.alive for w in s.workers.values()):
                return None
            need = 0
        if need <= 0 or s.broken is not None:
            return []
        new = s.new_workers(need)
        now = time.monotonic()
        for w in new:
            if self.to_place:
                self.placement_of[w.id] = self.to_place.pop(0)
            elif self.place_next is not None:
                self.placement_of[w.id] = self.place_next(self._held())
            else:
                self.placement_of[w.id] = 0
            self.start_began[w.id] = now
        return new

    def _held(self) -> list[int]:
        """The workers each placement holds (alive, not let go; the last: of none)."""
        held = [0] * (len(self.placements) + 1)
        for w in self._scheduler.workers.values():
            index = self.placement_of.get(w.id)
            if index is not None and w.alive and not w.stopping:
                held[min(index, len(self.placements))] += 1
        return held

    def set_placements(self, placements: list[Placement]) -> None:
        """Start workers in ``placements`` from now on (the lock is held). A worker
        keeps its place if a new placement has its backend instance, else it is of
        none (index past the last: the policy gives it back first)."""
        old = self.placements
        for w in self._scheduler.workers.values():
            backend = self.placement(self.placement_of.get(w.id, 0)).backend
            self.placement_of[w.id] = next(
                (i for i, p in enumerate(placements) if p.backend is backend),
                len(placements))
        self.placements = placements
        self.to_place = []
        del old

    def placement_name(self, wid: int) -> str:
        """The name of the placement the worker ``wid`` was started in."""
        return self.placement(self.placement_of.get(wid, 0)).name

    def placement(self, index: int) -> Placement:
        """The placement ``index`` (the first for one no longer listed)."""
        return self.placements[index] if index < len(self.placements) else self.placements[0]

    def _start(self, job: list[Worker]) -> None:
        """Start the job of the workers ``job`` (on a starter thread)."""
        s = self._scheduler
        index = self.placement_of.get(job[0].id, 0)
        process = self.placement(index).make_process([w.id for w in job])
        placed = self.on_failure is not None
        try:
            # a placement does not wait out its backend's transient errors: it is
            # skipped for a while (the driver's backoff, which logs it: one line for
            # the event, not the retry's too), the others carry on
            if placed:
                with retry.not_retrying():
                    process.start()
            else:
                with retry.pausing(self._retry_pause):
                    process.start()
        except Exception as exc:  # noqa: BLE001 - the pool reports it through results
            with self._changed:
                unwanted = self._unwanted()
                report = self.on_failure
                if unwanted or report is not None:
                    for w in job:
                        s.start_failed(w)
                        self.start_began.pop(w.id, None)
                if report is not None and not unwanted:
                    # not replaced behind the driver's back: it decides again
                    s.target = max(0, s.target - len(job))
                    report(index, f"{type(exc).__name__}: {exc}")
            if unwanted or report is not None:
                return
            logger.error("cannot start a pool worker: %s", exc)
            self._break(exc)
            with self._changed:
                for w in job:
                    s.start_failed(w)
            return
        for w in job:
            w.process = process
        with self._changed:
            for w in job:
                self.start_began.pop(w.id, None)
            self.processes.append(process)
            if len(self.processes) >= self._prune_at:
                # the ended ones are dropped when the list has doubled since the last
                # time (each start scanned it all: quadratic at thousands, issue #29)
                self.processes[:] = [p for p in self.processes if p.exitcode is None]
                self._prune_at = max(PRUNE_AT, 2 * len(self.processes))
            # (the finalizer is no longer alive once it has begun: from then on it ends
            # the processes it found, and this one is not among them)
            late = s.state == TERMINATE or not self.finalizer.still_active() \
                or s.broken is not None
        if late:
            # terminate(), the collection of the pool or its break (another worker's
            # start raised) ended the workers it knew of while this one was starting
            terminate_workers([process], None, self._cid)
            if s.broken is not None:
                with self._changed:
                    failed = [outcome for w in job for outcome in s.lose(w)]
                settle(failed)
            else:
                with self._changed:  # it never runs: no longer counted as starting
                    for w in job:
                        s.start_failed(w)
            return
        ref = weakref.ref(self)

        def ended() -> None:
            workers = ref()
            if workers is not None:
                workers._ended(job)

        process._popen.add_done_callback(ended)

    def _start_died(self, job: list[Worker], error: BaseException) -> None:
        """A start raised what :meth:`_start` does not handle (a bug, or the injected
        fault of a test): the pool breaks with it, as for a start that failed, rather
        than wait for workers nobody starts."""
        self._break(error)
        with self._changed:
            for w in job:
                if w.process is None:
                    self._scheduler.start_failed(w)

    def _unwanted(self) -> bool:
        """No worker is wanted any more: the pool was terminated or collected, or it
        is closed with nothing left to do. Called with the lock held."""
        s = self._scheduler
        return (s.state == TERMINATE or not self.finalizer.still_active()
                or (s.state == CLOSE and not s.unfinished()))

    def _retry_pause(self, seconds: float) -> bool:
        """Wait between two tries of a worker's start; True: give up (not wanted)."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while not self._unwanted():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def _ended(self, job: list[Worker]) -> None:
        """The job of the workers ``job`` ended (they are lost, if they were not)."""
        s = self._scheduler
        w = job[0]
        job_popen = w.process._popen if w.process is not None else None
        # a start failure when none of its workers got as far as connecting (counted
        # once per job, however many workers it ran)
        if job_popen is not None and not any(x.connected for x in job) \
                and not all(x.stopping for x in job) \
                and s.state != TERMINATE and job_popen.failed_on_its_own:
            with self._changed:
                report = self.on_failure
                if report is not None:  # the placement is skipped a while, the pool goes on
                    report(self.placement_of.get(w.id, 0),
                           f"a job ended (exit code {job_popen.returncode}) before its "
                           "worker connected")
                    failures = 0
                else:
                    s.start_failures += 1
                    failures = s.start_failures
            if failures >= START_FAILURES_LIMIT:
                self._break(job_popen.start_error or ProcessStartError(
                    f"{failures} pool workers in a row exited (last exit code "
                    f"{job_popen.returncode}) before they could take tasks; see their output "
                    "above"))
        with self._changed:
            failed = [outcome for x in job for outcome in s.lose(x)]
            for x in job:
                self.placement_of.pop(x.id, None)
                self.start_began.pop(x.id, None)
        settle(failed)

    def _break(self, exc: BaseException) -> None:
        """Workers cannot be started: fail everything waiting, refuse new work, and
        end the workers that did start (nothing will be given to them; the tasks they
        hold fail with ``exc`` as they are lost, see ``Scheduler.lose``)."""
        with self._changed:
            failed = self._scheduler.break_(exc)
            started = list(self.processes)
        settle(failed)
        if started:
            logger.info("ending the %d pool worker(s) started before the pool broke",
                        len(started))
            teardown.end_processes(started)

    # -- resizing -------------------------------------------------------------------
    def resize(self, processes: int) -> None:
        """Aim for ``processes`` workers; the ones let go finish what they hold."""
        s = self._scheduler
        with self._changed:
            s.check_running()
            s.target = processes
            live = [w for w in s.workers.values() if w.alive and not w.stopping]
            extra = len(live) - processes
            if extra > 0:
                live.sort(key=lambda w: (w.busy, w.connected))  # idle/unstarted first
                for w in live[:extra]:
                    self._retire(w)
            self._changed.notify_all()

    def retire_worker(self, w: Worker) -> None:
        """Let ``w`` go as :meth:`resize` does (the adaptive pool's driver; the lock is
        held): it finishes what it holds, a job not connected yet is ended."""
        self._retire(w)

    def alive(self) -> bool:
        """Whether the pool is neither collected nor ended at exit."""
        return self.finalizer.still_active()

    def break_pool(self, exc: BaseException) -> None:
        """The pool cannot go on (a thread it depends on died): as a failed start."""
        self._break(exc)

    def _retire(self, w: Worker) -> None:
        self._scheduler.retire(w)
        # a job that has not connected yet is ended, unless it runs other workers that
        # are kept (those let go connect, are told to stop and exit)
        if not w.connected and w.process is not None and all(
                x.stopping or not x.alive for x in self._scheduler.workers.values()
                if x.process is w.process):
            try:
                w.process.terminate()
            except Exception:  # noqa: BLE001 - the job may already be gone
                logger.debug("terminating unstarted worker failed", exc_info=True)

    # -- ending ---------------------------------------------------------------------
    def terminate(self) -> None:
        """Fail what is pending and end every worker now, including those whose start
        is under way; returns once they are gone."""
        with self._changed:
            failed = self._scheduler.terminate()
        if failed is None:
            return
        settle(failed)
        self.finalizer()
        # as multiprocessing's terminate() joins its workers: a worker whose start was
        # under way is ended by _start before this returns
        self._starter.shutdown(wait=True, cancel_futures=True)
        with self._changed:
            # the workers whose start was cancelled before it began never run either
            s = self._scheduler
            for w in [w for w in s.workers.values() if w.process is None and w.alive
                      and not w.connected]:
                s.start_failed(w)

    def join(self) -> None:
        """Wait for the workers to exit (after close() or terminate())."""
        state = self._scheduler.state
        if state == RUN:
            raise ValueError("Pool is still running")
        closing = state == CLOSE
        if closing:
            self._supervisor.join()
        # after this, every worker asked for is in processes; terminate() has already
        # ended (with bounded waits) those it knew of and the ones still starting
        self._starter.shutdown(wait=True)
        if not closing:
            return
        with self._changed:
            processes = list(self.processes)
        for p in processes:
            try:
                p.join()
            except ProcessStartError:
                pass
        if self.finalizer.still_active():  # closed and joined: nothing left to fail
            self.finalizer.cancel()
            terminate_workers(self.processes, self._hub, self._cid, self.channels)
