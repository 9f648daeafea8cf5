"""``fiber.Pool``: multiprocessing.Pool's API over job-backed workers.

The class here is the public face; the work is done in :mod:`fiber.runtime.pool`:

* the pending table (:mod:`~fiber.runtime.pool.scheduler`): queued tasks, the batches
  each worker holds, batch sizing and prefetch, requeueing the tasks of a lost worker
  (a chunk it was running is split into single items, so a task that kills every
  worker it lands on fails alone after ``max_task_attempts`` tries with
  :class:`fiber.WorkerLostError`);
* the worker set (:mod:`~fiber.runtime.pool.workers`): workers start asynchronously
  (tasks flow to the first worker that is up), a supervisor keeps the pool at its
  size, ``resize(n)`` grows or shrinks a running pool;
* the pool's hub channel (:mod:`~fiber.runtime.pool.channel`), the loop a worker runs
  (:mod:`~fiber.runtime.pool.worker`) and the result objects
  (:mod:`~fiber.runtime.pool.results`);
* the feeder of each ``imap``/``imap_unordered`` (:mod:`~fiber.runtime.pool.feeder`),
  which reads its input lazily, a bounded window ahead of the results taken;
* the chunking policy, the arguments' checks, the workers' jobs and the stats'
  assembly (``chunking``, ``checks``, ``placement``, ``stats``).

Pool drives the pending table only through the methods docs/architecture.md lists;
:meth:`Pool.stats` is a cheap, thread-safe snapshot of its workers and tasks.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from fiber import util
from fiber.backend import Resources
from fiber.process import Process
from fiber.runtime import arguments, config, progress, run, status
from fiber.runtime.pool import checks, chunking, placement
from fiber.runtime.pool.channel import PoolChannel, wait_directly
from fiber.runtime.pool.feeder import Feeder, feed_ended
from fiber.runtime.pool.observe import RunningTask, TaskError
from fiber.runtime.pool.results import (
    ApplyResult,
    AsyncResult,
    IMapIterator,
    IMapUnorderedIterator,
    MapResult,
)
from fiber.runtime.pool.scheduler import Scheduler
from fiber.runtime.pool.stats import PoolStats, WorkerStats, snapshot
from fiber.runtime.pool.tasks import RUN
from fiber.runtime.pool.uber02 import Uber02Methods
from fiber.runtime.pool.workers import Placement, WorkerSet
from fiber.wire import serialization
from fiber.wire.protocol import TaskKind

if TYPE_CHECKING:  # loaded by the first adapt() (pool.py's import stays as light as it was)
    import os

    from fiber.runtime.journal.durable import Durable
    from fiber.runtime.pool.adapt import Adapter, AdaptStats

__all__ = ["Pool", "PoolStats", "WorkerStats", "AdaptStats", "RunningTask", "TaskError", "AsyncResult", "ApplyResult", "MapResult",
           "IMapIterator", "IMapUnorderedIterator"]

# multiprocessing.pool's own classes, loaded on first use (5 ms of imports):
# RemoteTraceback is the ``__cause__`` of a task's exception re-raised in the parent,
# MaybeEncodingError the error of a task whose result cannot be pickled, and
# ThreadPool is multiprocessing's pool of threads of this process, as it is
_FROM_MULTIPROCESSING = ("RemoteTraceback", "MaybeEncodingError", "ThreadPool")
__all__ += _FROM_MULTIPROCESSING


def __getattr__(name: str) -> Any:
    if name == "AdaptStats":
        from fiber.runtime.pool.adapt import AdaptStats

        globals()[name] = AdaptStats
        return AdaptStats
    if name in _FROM_MULTIPROCESSING:
        import multiprocessing.pool

        value = getattr(multiprocessing.pool, name)
        globals()[name] = value
        return value
    if name in ("ZPool", "ResilientZPool"):
        # uber/fiber 0.2's pools (deprecated): its fiber.Pool was ResilientZPool (the
        # tasks of lost workers run again), as this Pool always is, ZPool's too
        util.warn_deprecated(f"fiber.pool.{name}",
                             f"fiber.pool.{name} is deprecated: use fiber.Pool")
        return Pool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_T = TypeVar("_T")
_S = TypeVar("_S")

_SEQUENCES = (list, tuple, range)
_P = TypeVar("_P", bound="Pool")


class Pool(Uber02Methods):
    """A pool of job-backed worker processes, as :class:`multiprocessing.pool.Pool`.

    fiber extensions (keyword-only): ``min_processes``/``max_processes`` bound
    :meth:`resize`; ``max_task_attempts`` (default: the ``max_task_attempts``
    setting, 3) is how many workers a task may lose before it fails; ``resources``
    (a :class:`fiber.Resources` or a mapping of its fields) is each worker's job's
    request, checked by the backend before any worker starts; ``workers_per_job``
    (default 1) runs that many workers in each job, which asks for ``resources`` times
    that many (a site that grants whole nodes: ``Pool(64, workers_per_job=32,
    resources={"cpu": 1})`` is two jobs of 32 CPUs; uber/fiber's ``cpu_per_job=N`` alone
    means ``workers_per_job=N``, a core each); the pool still counts workers,
    and a job that is lost loses its workers, whose tasks go to others as any lost
    worker's. ``context``: a fiber
    context's (``fiber.get_context("slurm")``) workers are its ``Process`` and run on
    its backend; other contexts (None, multiprocessing's) mean the default one.
    ``journal``: the path of a file (SQLite) where every result of the pool's maps and
    calls is journaled as it arrives; a program re-run with the same journal gets
    the results already there without running them again (docs/durable.md).
    """

    _wrap_exception = True

    def __init__(self, processes: int | None = None,
                 initializer: Callable[..., object] | None = None,
                 initargs: Iterable[Any] = (), maxtasksperchild: int | None = None,
                 context: Any = None, *, min_processes: int | None = None,
                 max_processes: int | None = None,
                 max_task_attempts: int | None = None,
                 error_handling: bool | None = None,
                 resources: Resources | Mapping[str, Any] | None = None,
                 workers_per_job: int | None = None,
                 journal: str | os.PathLike[str] | None = None) -> None:
        if error_handling is not None:
            util.warn_deprecated(
                "Pool(error_handling)",
                "Pool(error_handling=...) is deprecated and ignored: a fiber Pool always "
                "recovers from lost workers (their tasks run again, see max_task_attempts)")
        # raise here, not in the threads that start the workers (see Process.start)
        run.check_not_importing_main()
        processes, self._bounds = checks.pool_arguments(
            processes, maxtasksperchild, initializer, min_processes, max_processes,
            max_task_attempts)
        initargs = tuple(initargs)
        # validate what every worker will receive, once, before starting any
        serialization.dumps_code((initializer, initargs))
        # where the workers run: the target of a fiber context, else (None, or a
        # context of multiprocessing's) the default one; they are its Process
        ctx: Any = context if run.carries(context) else None
        target = run.of(ctx)
        process_class = ctx.Process if ctx is not None else Process
        # checked (uber/fiber's cpu_per_job packs workers into jobs unless the pool says how)
        resources, workers_per_job = placement.uber_packing(target, resources, workers_per_job)
        # each worker's request; a job of several workers asks for it times their number
        requested = placement.job_request(target, resources, workers_per_job)
        # a durable pool's journal, opened (and locked) before any worker starts
        self._durable: Durable | None = None
        if journal is not None:
            from fiber.runtime.journal.durable import Durable
            self._durable = Durable(self, journal)
        self._progress = progress.enabled()  # the progress setting (checked here)
        self._lock = threading.RLock()
        changed = threading.Condition(self._lock)
        self._changed = changed
        # the feeders of running imaps: woken, as the supervisor, when the table
        # notifies (close, terminate); the closure does not hold the pool
        self._feeders: set[Feeder] = set()
        feeders = self._feeders

        def notify() -> None:
            changed.notify_all()
            for feed in list(feeders):
                feed.wake()

        self._scheduler = Scheduler(
            processes, max_task_attempts or config.get_config().max_task_attempts,
            maxtasksperchild, notify)
        hub = target.hub()
        channel = PoolChannel(self._scheduler, self._lock)
        self._cid = hub.add_channel(channel, stream=True)
        channel.serve_as(self._cid)
        self._address = hub.stream_address
        self._adapter: Adapter | None = None
        # what adapt(placements=) needs to start workers in other contexts
        self._job_args: placement.JobArgs = (initializer, initargs, resources,
                                             workers_per_job)
        self._cids: dict[int, int] = {id(hub): self._cid}  # the pool's channel per hub
        self._worker_set = WorkerSet(
            self, self._scheduler, changed,
            placement.maker(self._address, self._cid, process_class, self._job_args,
                            requested),
            hub, self._cid, target.backend(), workers_per_job)
        self._own_placement = self._worker_set.placements[0]
        status.register_pool(self, hub)  # fiber top can see it (runtime/status.py)

    # -- size -----------------------------------------------------------------------
    @property
    def processes(self) -> int:
        """fiber extension: the number of workers the pool aims to have."""
        return self._scheduler.size()

    @property
    def min_processes(self) -> int:
        """fiber extension: the smallest size :meth:`resize` accepts."""
        return self._bounds.least

    @property
    def max_processes(self) -> int | None:
        """fiber extension: the largest size :meth:`resize` accepts (None: unbounded)."""
        return self._bounds.most

    @property
    def max_task_attempts(self) -> int:
        """fiber extension: how many workers a task may lose before it fails."""
        return self._scheduler.max_attempts()

    def resize(self, processes: int) -> None:
        """fiber extension: grow or shrink the pool while it runs. A worker that is let
        go finishes the tasks it holds first. Checked as ``Pool(processes)`` is. On an
        adapting pool (:meth:`adapt`) it turns adapting off: the pool keeps the size
        given from then on."""
        processes = arguments.pool_size(processes)
        self._bounds.check(processes)
        with self._lock:
            self._scheduler.check_running()
            if self._adapter is not None:
                self._adapter.stop()
                self._adapter = None
            self._worker_set.resize(processes)

    def adapt(self, minimum: int = 0, maximum: int | None = None, *,
              idle_timeout: float = 30.0, growth: float = 2.0,
              placements: Sequence[tuple[Any, int]] | None = None) -> None:
        """fiber extension (named after dask's ``Cluster.adapt``): from now on the pool
        sizes itself between ``minimum`` and ``maximum`` workers: it grows while tasks
        wait (one worker per queued task, at most ``growth`` times the workers up
        coming at once, 4 however few are up), and gives back a worker that has been
        idle ``idle_timeout`` seconds, down to ``minimum`` (0: no worker between
        bursts; the next task starts one). Workers whose job the cluster still queues
        count as coming, and are cancelled when no longer needed; a worker is given
        back only between tasks. ``maximum`` defaults to ``max_processes``, else to
        the pool's size. ``placements``: ``(context, maximum)`` pairs, fiber contexts
        in order of preference, each with its own maximum: workers start in the first
        with room (``maximum`` defaults to the sum); the last's are given back first;
        one whose start fails is skipped a while. Called again, it changes the
        settings; :meth:`resize` turns adapting off. See docs/adapt.md."""
        settings, contexts = checks.adapt_settings(
            minimum, maximum, idle_timeout, growth, placements,
            size=self._scheduler.size(), bounds=self._bounds)
        from fiber.runtime.pool.adapt import Adapter  # (loaded by the first adapt())
        places = [self._placement(ctx) for ctx in contexts]  # may ask the backends
        placement.distinct(places)  # (ValueError: a backend named twice)
        with self._lock:
            self._scheduler.check_running()
            self._worker_set.set_placements(places or [self._own_placement])
            if self._adapter is not None:
                self._adapter.update(settings)
            else:
                self._adapter = Adapter(self._scheduler, self._changed,
                                        self._worker_set, settings)

    def _placement(self, ctx: Any) -> Placement:
        """The placement of the fiber context ``ctx`` for this pool's workers: its
        Process on its backend, reaching the pool's channel on its hub."""
        return placement.place(run.of(ctx), ctx.Process, self._job_args, self._channel_on)

    def _channel_on(self, hub: Any) -> int:
        """The pool's channel on ``hub``, added there once (if not the pool's own)."""
        with self._lock:
            cid = self._cids.get(id(hub))
            if cid is None:
                channel = PoolChannel(self._scheduler, self._lock)
                cid = self._cids[id(hub)] = hub.add_channel(channel, stream=True)
                channel.serve_as(cid)
                self._worker_set.channels.append((hub, cid))
            return cid

    # -- inspection -----------------------------------------------------------------
    def stats(self) -> PoolStats:
        """fiber extension: a consistent snapshot of the pool's workers and tasks.

        Safe to call from any thread at any time, also after ``close()`` or
        ``terminate()``; it costs a pass over the workers under the pool's lock (not
        over the tasks), so it can be polled, e.g. by a live view."""
        with self._lock:
            adapter = self._adapter
            return snapshot(self._scheduler,
                            None if adapter is None else adapter.stats(),
                            self._worker_set.placement_name)

    @property
    def _pool(self) -> list[Process]:
        """The live workers' processes, as multiprocessing's ``Pool._pool``."""
        with self._lock:
            return self._scheduler.processes()

    @property
    def _processes(self) -> int:
        """The pool's size, as multiprocessing's ``Pool._processes``."""
        return self._scheduler.size()

    # -- submitting -----------------------------------------------------------------
    def apply(self, func: Callable[..., _T], args: Iterable[Any] = (),
              kwds: Mapping[str, Any] | None = None) -> _T:
        """``func(*args, **kwds)`` in a worker; waits for the result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., _T], args: Iterable[Any] = (),
                    kwds: Mapping[str, Any] | None = None,
                    callback: Callable[[_T], object] | None = None,
                    error_callback: Callable[[BaseException], object] | None = None,
                    ) -> ApplyResult[_T]:
        """``func(*args, **kwds)`` in a worker; returns its :class:`AsyncResult`."""
        if callback is not None or error_callback is not None:  # (no call more without)
            checks.callbacks(callback, error_callback)
        result: ApplyResult[_T] = ApplyResult(callback, error_callback)
        if self._durable is not None:
            return self._durable.apply(func, args, kwds, result)
        self._submit_call(func, args, kwds, result, result)
        return result

    def _submit_call(self, func: Callable[..., Any], args: Iterable[Any],
                     kwds: Mapping[str, Any] | None, result: ApplyResult[Any],
                     sink: Any) -> None:
        """Submit ``func(*args, **kwds)``, its outcome going to ``sink`` (the result,
        or what journals it on the way), read directly by ``result.get()``."""
        with self._lock:
            task = self._scheduler.submit_call(func, args, kwds, sink)
        result._task, result._direct = task, wait_directly

    def _size_hint(self) -> int:
        """The workers a map is chunked for (:func:`chunking.map_workers`)."""
        adapter = self._adapter
        return chunking.map_workers(self._scheduler.size(),
                                    None if adapter is None else adapter.settings.maximum)

    def _chunks(self, func: Callable[..., Any], items: Sequence[Any], chunksize: int | None,
                kind: int, sink: Any, call: str) -> Any:
        chunksize = chunking.map_chunksize(len(items), self._size_hint(), chunksize)
        counted = progress.watch(sink, len(items), self._scheduler, call) \
            if self._progress else sink
        # submitted a group of chunks at a time, each handed out at once; the pool's
        # lock is released between groups for the results coming back
        step = chunking.submit_step(chunksize)
        self._scheduler.check_running()
        for start in range(0, len(items), step):
            later = max(0, len(items) - start - step)  # items of the groups still to come
            with self._lock:
                self._scheduler.submit_chunks(func, items, chunksize, kind, counted,
                                              start=start, first=start, last=start + step,
                                              ahead=-(-later // chunksize))
        return sink

    def map(self, func: Callable[[_S], _T], iterable: Iterable[_S],
            chunksize: int | None = None) -> list[_T]:
        """``[func(x) for x in iterable]`` over the workers; waits for the list (on a
        durable pool, until its results are journaled too)."""
        values = self._map_async(func, iterable, chunksize, None, None, "map").get()
        if self._durable is not None:
            self._durable.journal.flush()
        return values

    def map_async(self, func: Callable[[_S], _T], iterable: Iterable[_S],
                  chunksize: int | None = None,
                  callback: Callable[[list[_T]], object] | None = None,
                  error_callback: Callable[[BaseException], object] | None = None,
                  ) -> MapResult[_T]:
        """As :meth:`map`; returns its :class:`MapResult`."""
        return self._map_async(func, iterable, chunksize, callback, error_callback,
                               "map_async")

    def _map_async(self, func: Callable[..., _T], iterable: Iterable[Any],
                   chunksize: int | None,
                   callback: Callable[[list[_T]], object] | None,
                   error_callback: Callable[[BaseException], object] | None,
                   call: str, kind: int = TaskKind.MAP) -> MapResult[_T]:
        checks.callbacks(callback, error_callback)
        if chunksize is not None:
            arguments.chunksize(chunksize)
        if kind == TaskKind.STARMAP:
            items: Sequence[Any] = [tuple(x) for x in iterable]
        else:  # a list, tuple or range is chunked as it is (slices; a range's travel
            # as ranges), anything else read into a list first, as multiprocessing does
            items = iterable if isinstance(iterable, (list, tuple, range)) else list(iterable)
        result: MapResult[_T] = MapResult(len(items), callback, error_callback)
        chunks = self._chunks if self._durable is None else self._durable.chunks
        return chunks(func, items, chunksize, kind, result, call)

    def starmap(self, func: Callable[..., _T], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[_T]:
        """``[func(*args) for args in iterable]`` over the workers (on a durable pool,
        returning once its results are journaled too)."""
        values = self._map_async(func, iterable, chunksize, None, None, "starmap",
                                 TaskKind.STARMAP).get()
        if self._durable is not None:
            self._durable.journal.flush()
        return values

    def starmap_async(self, func: Callable[..., _T], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None,
                      callback: Callable[[list[_T]], object] | None = None,
                      error_callback: Callable[[BaseException], object] | None = None,
                      ) -> MapResult[_T]:
        """As :meth:`starmap`; returns its :class:`MapResult`."""
        return self._map_async(func, iterable, chunksize, callback, error_callback,
                               "starmap_async", TaskKind.STARMAP)

    def _imap(self, func: Callable[[_S], _T], iterable: Iterable[_S], chunksize: int,
              result: IMapIterator[_T], call: str) -> IMapIterator[_T]:
        chunksize = arguments.chunksize(chunksize)
        if self._durable is not None:
            return self._durable.imap(func, iterable, chunksize,
                                      type(result) is IMapIterator, call)
        limit = chunking.window(self._size_hint(), chunksize) * chunksize
        if type(iterable) in _SEQUENCES and len(iterable) <= limit:  # type: ignore[arg-type]
            # a short list, tuple or range (reading it cannot fail, block or change
            # anything): submitted at once, as map's, without a thread or a copy
            items: Sequence[Any] = iterable  # type: ignore[assignment]
            counted = progress.watch(result, len(items), self._scheduler, call) \
                if self._progress else result
            with self._lock:
                self._scheduler.submit_chunks(func, items, chunksize, TaskKind.MAP,
                                              counted)
            result._set_length(len(items))
            return result
        feed = Feeder(self._scheduler, self._lock, func, iterable, chunksize,
                      TaskKind.MAP, result,
                      functools.partial(feed_ended, self._scheduler, self._lock,
                                        self._feeders))
        with self._lock:
            self._scheduler.feed_started()
            self._feeders.add(feed)
        feed.start()
        return result

    def imap(self, func: Callable[[_S], _T], iterable: Iterable[_S],
             chunksize: int = 1) -> IMapIterator[_T]:
        """Results in input order as they arrive; the iterable is read lazily, a
        bounded window ahead of the results taken (:mod:`fiber.runtime.pool.feeder`)."""
        return self._imap(func, iterable, chunksize, IMapIterator(), "imap")

    def imap_unordered(self, func: Callable[[_S], _T], iterable: Iterable[_S],
                       chunksize: int = 1) -> IMapIterator[_T]:
        """Results in the order they finish; the iterable is read lazily, as ``imap``'s."""
        return self._imap(func, iterable, chunksize, IMapUnorderedIterator(),
                          "imap_unordered")

    # -- ending ---------------------------------------------------------------------
    def close(self) -> None:
        """No more tasks; workers exit once every submitted task is done."""
        with self._lock:
            self._scheduler.close()

    def terminate(self) -> None:
        """Stop the workers now; results still pending fail."""
        self._worker_set.terminate()
        if self._durable is not None:  # its journal committed and let go
            self._durable.release()

    def join(self) -> None:
        """Wait for the workers to exit (after close() or terminate()), and for the
        threads reading the input of imaps (as multiprocessing's task handler)."""
        self._worker_set.join()
        with self._lock:
            feeders = list(self._feeders)
            adapter = self._adapter
        if adapter is not None and adapter.thread is not threading.current_thread():
            adapter.thread.join()
        for feed in feeders:
            feed.thread.join()
        if self._durable is not None:
            self._durable.release()

    def __enter__(self: _P) -> _P:
        self._scheduler.check_running()
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc_val: BaseException | None, exc_tb: TracebackType | None) -> None:
        self.terminate()

    def __del__(self, _warn: Callable[..., object] = warnings.warn) -> None:
        # as multiprocessing's (its text too: a warnings filter written for it matches)
        scheduler = getattr(self, "_scheduler", None)  # None: __init__ raised
        if scheduler is not None and scheduler.pool_state() == RUN:
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning, source=self)

    def __repr__(self) -> str:
        s = self._scheduler
        return f"<fiber.Pool state={s.pool_state()} pool_size={s.size()}>"

    def __reduce__(self) -> NoReturn:
        raise NotImplementedError(
            "pool objects cannot be passed between processes or pickled")

