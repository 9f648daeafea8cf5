"""Where a pool's workers run: the job each worker (or group of workers) is, and the
:class:`~fiber.runtime.pool.workers.Placement` of a fiber context.

A worker's job is its context's ``Process`` (passed in: the runtime does not import
the API) running :func:`~fiber.runtime.pool.worker.worker`, or
:func:`~fiber.runtime.pool.worker.worker_group` for several workers in one job
(``workers_per_job``). Its request is checked by the context's backend when the pool
is made, or a placement added (:func:`job_request`), before any worker starts; the
placements of one pool are distinct backends (:func:`distinct`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from fiber.backend import Resources
from fiber.runtime.pool import checks
from fiber.runtime.pool.worker import worker, worker_group
from fiber.runtime.pool.workers import Placement

#: what every worker's job gets: (initializer, initargs, resources, workers_per_job)
JobArgs = tuple[Callable[..., object] | None, tuple[Any, ...], Any, int]


def worker_process(address: str, cid: int, initializer: Callable[..., object] | None,
                   initargs: tuple[Any, ...], wids: list[int], *, process_class: type,
                   resources: Resources | None = None) -> Any:
    """The job of the pool workers ``wids``, a ``process_class``: one worker, or several
    in one job (``workers_per_job``), whose request is ``resources`` times their
    number."""
    if len(wids) == 1:
        return process_class(target=worker, name=f"PoolWorker-{wids[0]}", daemon=True,
                             args=(address, cid, wids[0], initializer, initargs),
                             resources=resources)
    return process_class(target=worker_group, name=f"PoolWorkers-{wids[0]}-{wids[-1]}",
                         daemon=True, args=(address, cid, wids, initializer, initargs),
                         resources=None if resources is None else resources.scaled(len(wids)))


def uber_packing(target: Any, resources: Any,
                 per_job: int | None) -> tuple[Resources | None, int]:
    """A pool's ``resources`` and ``workers_per_job`` (None: not given) on ``target``:
    as given, except where uber/fiber 0.2's ``cpu_per_job`` setting asks for more than
    one core per job and the pool names neither: then, as uber/fiber packed
    ``cpu_per_job`` workers into each job, each job runs that many workers and asks for
    ``cpu_per_job`` cores (one per worker) and the ``memory`` setting (its
    ``mem_per_job``), not that many times each. fiber's own ``cpu`` setting keeps its
    meaning: the cores of every job, so of every worker. A ``workers_per_job`` given is
    checked here (:func:`~fiber.runtime.pool.checks.workers_per_job`)."""
    if per_job is not None:
        checks.workers_per_job(per_job)
    given = None if resources is None else Resources.of(resources)
    if per_job is not None:
        return given, per_job
    cfg = target.config()
    cpu = cfg.values.get("cpu")
    if (cfg.old_names.get("cpu") != "cpu_per_job" or cpu is None or cpu < 2
            or cpu != int(cpu) or (given is not None and given.cpu is not None)):
        return given, 1
    n = int(cpu)
    memory = cfg.values.get("memory")
    if given is not None and given.memory is not None:
        memory = None  # the pool's own request, per worker
    elif memory is not None:
        memory = -(-int(memory) // n)  # the job's, shared by its workers
    return Resources(cpu=1, memory=memory).merged(given), n


def job_request(target: Any, resources: Any, per_job: int) -> Resources:
    """Each worker's request on ``target`` (a run target, :func:`fiber.runtime.run.of`):
    its settings' with the pool's ``resources`` on top, checked by its backend; a job
    of ``per_job`` workers, which asks for that times their number, is checked too."""
    requested: Resources = target.resources(
        None if resources is None else Resources.of(resources))
    if per_job > 1:
        target.resources(requested.scaled(per_job))
    return requested


def maker(address: str, cid: int, process_class: type, job_args: JobArgs,
          requested: Resources) -> Callable[[list[int]], Any]:
    """What makes a job's process for workers reaching the pool's channel ``cid`` at
    ``address``."""
    initializer, initargs, _, _ = job_args
    return functools.partial(worker_process, address, cid, initializer, initargs,
                             process_class=process_class, resources=requested)


def place(target: Any, process_class: type, job_args: JobArgs,
          channel_on: Callable[[Any], int]) -> Placement:
    """The placement of a fiber context (its run ``target`` and ``Process``) for a
    pool's workers: their request checked, the pool's channel on the target's hub
    (``channel_on(hub)``: its id, the channel added there once)."""
    requested = job_request(target, job_args[2], job_args[3])
    hub = target.hub()
    cid = channel_on(hub)
    name = target.config().backend
    if target.overrides:
        name += "(" + ", ".join(f"{k}={v!r}" for k, v in sorted(target.overrides.items())) + ")"
    return Placement(name, maker(hub.stream_address, cid, process_class, job_args, requested),
                     target.backend(), hub, cid)


def distinct(places: Sequence[Placement]) -> None:
    """adapt's placements are distinct backends: two contexts of one backend instance
    (the same name and settings) would be one placement counted twice, the workers of
    both counted in the first."""
    for j, later in enumerate(places):
        for i, earlier in enumerate(places[:j]):
            if later.backend is earlier.backend:
                raise ValueError(
                    f"placements {i} and {j} are the same backend ({earlier.name}): name "
                    "each context once, with the sum of their maxima")
