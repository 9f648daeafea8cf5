"""The adaptive pool's burst over two placements (issue #28), shared by the cluster
backends' tests/*/test_pool_adapt.py (slurm, k8s, docker, ssh) and the local ones.

:func:`burst_and_back` is the test they all run: ``Pool(1, context=local)`` adapting
over the local backend (up to 2 workers) then the cluster backend (up to ``maximum``),
one map of ``n`` tasks of 0.5 s; every task once and in order, never more workers in a
placement than its maximum, tasks on both placements, both back at zero after the
idle timeout, nothing of the run left on the cluster, and the next map right. What is
particular to a backend is passed in: the task that says where it ran, which of those
places is the cluster's, and what "nothing left on the cluster" means there (asked of
the real engine). It prints the time from the map to the first task on the cluster
(bench/results/adapt/first-task.md). Nothing is faked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sized
from typing import Any

import fiber


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             every: float = 0.2) -> None:
    """Poll ``predicate`` every ``every`` seconds; AssertionError naming ``what`` when
    it is still false after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(every)


def held(pool: Any) -> list[int]:
    """The workers each placement of an adapting pool holds (busy, idle, starting and
    pending in the cluster), in the placements' order."""
    return [p.busy + p.idle + p.starting + p.pending
            for p in pool.stats().adapt.placements]


def most_held(pool: Any, result: Any) -> list[int]:
    """The most each placement held at once while ``result`` was not ready."""
    most = [0] * len(pool.stats().adapt.placements)
    while not result.ready():
        most = [max(m, c) for m, c in zip(most, held(pool), strict=True)]
        time.sleep(0.1)
    return most


def burst_and_back(backend: str, maximum: int, where: Callable[[int], tuple[int, float, Any]],
                   on_backend: Callable[[Any], bool], left: Callable[[], Sized], nothing_left: str,
                   *, n: int = 80, final_timeout: float = 90) -> None:
    """Run the burst from local (max 2) to ``backend`` (max ``maximum``) and back.

    ``where(i)`` is the task: it sleeps 0.5 s and returns ``(i, when it began, its
    place)``; ``on_backend(place)`` says whether that place is one of ``backend``'s
    workers. ``left()`` lists what the run still has on the cluster (``nothing_left``
    says what an empty list means): it must be empty within 60 s of both placements
    reaching zero, and again within ``final_timeout`` s after the pool is terminated.
    """
    local, cluster = fiber.get_context("local"), fiber.get_context(backend)
    pool = fiber.Pool(1, context=local)
    try:
        pool.adapt(0, placements=[(local, 2), (cluster, maximum)], idle_timeout=2.0)
        started = time.time()
        result = pool.map_async(where, range(n), chunksize=1)
        most = most_held(pool, result)
        out = result.get()
        took = time.time() - started
        assert [i for i, _, _ in out] == list(range(n))
        assert most[0] <= 2 and most[1] <= maximum, most
        remote = [began for _, began, place in out if on_backend(place)]
        on_local = [began for _, began, place in out if not on_backend(place)]
        assert remote and on_local, (len(remote), len(on_local))
        first = min(remote) - started
        print(f"adaptive pool local 2 + {backend} {maximum}, {n} tasks of 0.5 s: "
              f"{took:.1f} s; {len(remote)} on {backend}; first task on {backend} "
              f"{first:.2f} s after the map")
        wait_for(lambda: held(pool) == [0, 0], 60, "both placements at zero")
        wait_for(lambda: not left(), 60, nothing_left)
        assert pool.map(abs, range(-3, 3)) == [3, 2, 1, 0, 1, 2]
    finally:
        pool.terminate()
        pool.join()
    wait_for(lambda: not left(), final_timeout, nothing_left)
