"""The pool's chunking policy, in one place: how a map's input is cut into tasks, how
many of them an imap keeps submitted ahead, and how many tasks one batch to a worker
carries.

Three users ask it, each for its own part:

* :class:`fiber.Pool` (``map``, ``starmap``, the short ``imap``): :func:`map_workers`
  (the workers a map is chunked for), :func:`map_chunksize` (the chunk size a map
  gets) and :func:`submit_step` (how many items it submits under the pool's lock at
  once);
* the feeder of an ``imap`` (:mod:`~fiber.runtime.pool.feeder`): :func:`window`, the
  chunks submitted and not taken by the caller, at most;
* the pending table (:mod:`~fiber.runtime.pool.scheduler`): :func:`goes_alone`,
  :func:`batch_tasks`, :func:`least_batch` and :data:`BATCH_ITEMS`, the limits of a
  batch.

Plain arithmetic, no state: ``tests/core/test_pool_chunking.py`` pins its answers.
"""

from __future__ import annotations

import pickle
from typing import Any

from fiber.runtime import arguments

# -- a map's chunks ----------------------------------------------------------------
CHUNKS_PER_MAP_WORKER = 4  # a map's default chunk size cuts it in 4 chunks per worker
SUBMIT_GROUP = 1024  # items (or one chunk, if larger) a map submits under the lock at once

# -- an imap's window (the feeder) ---------------------------------------------------
READ_AHEAD = 8192  # items a window holds at least (small chunks batch well)...
READ_AHEAD_BYTES = 64 << 20  # ...unless they are big: as many as fit here (pickled)
CHUNKS_PER_WORKER = 4  # chunks a window holds at least per worker (running + in advance)
# chunks a window holds at least, within MIN_CHUNKS_ITEMS items: with fewer, a pool of a
# few workers that share batches of chunks runs dry between two refills (at chunksize
# 1,000 on 2 workers, a window of 10 chunks made imap 1.4x slower than multiprocessing;
# at chunksize 100, 82 chunks took 0.27-0.35 s for 1,000,000 items, 256 0.20-0.22 s)
MIN_CHUNKS = 256
MIN_CHUNKS_ITEMS = 1 << 20

# -- a batch (the pending table) -----------------------------------------------------
MAX_BATCH = 128  # tasks a batch takes after its first, at most (a unit of sending only)
BATCH_ITEMS = 2048  # items of small chunks a batch takes, at most (a chunk this big goes alone)
#: tasks that take longer (seconds, the pool's recent average) are sent one per batch
LONG_TASK = 0.005


def map_workers(size: int, adapt_maximum: int | None) -> int:
    """The workers a map is chunked for: the pool's ``size``, or an adapting pool's
    maximum (it may have no worker when the map comes)."""
    if adapt_maximum is not None:
        return max(1, adapt_maximum)
    return max(1, size)


def map_chunksize(items: int, workers: int, chunksize: int | None) -> int:
    """The chunk size of a map of ``items`` items over ``workers`` workers: the one
    given (checked: multiprocessing's map hangs on a float, returns [] for 0), else
    :data:`CHUNKS_PER_MAP_WORKER` chunks per worker, rounded up, at least 1 item (as
    multiprocessing's)."""
    if chunksize is not None:
        return arguments.chunksize(chunksize)
    size, extra = divmod(items, workers * CHUNKS_PER_MAP_WORKER)
    return max(1, size + (1 if extra else 0))


def submit_step(chunksize: int) -> int:
    """The items a map submits in one go under the pool's lock: whole chunks, about
    :data:`SUBMIT_GROUP` items (one chunk, if larger), so the workers start on the
    first chunks while the next are made and results come back between groups."""
    return chunksize * max(1, SUBMIT_GROUP // chunksize)


def window(processes: int, chunksize: int, item_bytes: int = 0) -> int:
    """How many chunks an imap keeps submitted and not taken by the caller, at most
    (in items: this times ``chunksize``), for items of about ``item_bytes`` pickled."""
    fit = READ_AHEAD_BYTES // max(1, item_bytes)  # items the byte budget holds
    items = min(READ_AHEAD, fit)
    least = min(MIN_CHUNKS, min(MIN_CHUNKS_ITEMS, fit) // chunksize)
    return max(CHUNKS_PER_WORKER * processes + 2, least, -(-items // chunksize))


def pickled_size(item: Any) -> int:
    """The size of ``item`` pickled (0 when it cannot be: sending it will say why)."""
    try:
        return len(pickle.dumps(item, pickle.HIGHEST_PROTOCOL))
    except Exception:  # noqa: BLE001 - only an estimate
        return 0


def goes_alone(items: int, task_seconds: float | None) -> bool:
    """Whether a task of ``items`` items is sent in a batch of its own: a big chunk, or
    any task when tasks take long enough lately (``task_seconds``) that batching saves
    nothing (one task per batch keeps a map's tail even)."""
    return items >= BATCH_ITEMS or (task_seconds is not None and task_seconds >= LONG_TASK)


def batch_tasks(queued: int, workers: int) -> int:
    """How many more tasks a batch takes after its first, with ``queued`` tasks left in
    the queue for ``workers`` workers (the pool's size: the first workers up must not
    take the work of those still starting): half of their share, at most
    :data:`MAX_BATCH`; the batch stops earlier at :data:`BATCH_ITEMS` items."""
    return min(MAX_BATCH, queued // (2 * max(1, workers)))


def least_batch(task_seconds: float | None, round_trip: float | None) -> int:
    """How many more tasks a batch takes after its first, at least, once a task's time
    (``task_seconds``) and a recall's round trip through the master (``round_trip``)
    are measured: the tasks that run in one round trip, at most :data:`MAX_BATCH`
    (0 until both are known). A smaller batch costs the master a message pair for less
    work than the round trip a recall would take to even it out, and a worker holding
    less than that is not worth a recall (issue #29: at 10,000 simulated workers the
    master's turnaround is far longer than a 1 ms task, and a map's tail went out one
    task per batch)."""
    if not task_seconds or round_trip is None:
        return 0
    return min(MAX_BATCH, int(round_trip / task_seconds))
