"""Memory released when multiprocessing releases it, on the selected backend: once a
pool's call has returned (and its result object is dropped), nothing of fiber's refers
to the call's arguments, its tasks or its results; a process that ended and was closed
(or joined) is not kept by fiber. Checked with weak references, on every map flavour
and on ``apply_async``/``apply``, with the pool still running."""

from __future__ import annotations

import functools
import gc
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fiber


class Box:
    """An argument or a result that can be referred to weakly."""

    def __init__(self, value: int) -> None:
        self.value = value


def double(box: Box) -> Box:
    return Box(box.value * 2)


def add(a: Box, b: Box) -> Box:
    return Box(a.value + b.value)


def _alive(refs: list[weakref.ref[Any]]) -> int:
    """How many of ``refs`` still refer to an object once the pool's threads are done
    with the call: a result is delivered by another thread, which may still hold it for
    a moment after ``get()`` returned (as multiprocessing's result handler does; it
    drops its cache entry after waking the waiter), so they have up to 5 s to let go;
    an object kept stays alive."""
    deadline = time.monotonic() + 5
    while True:
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


@pytest.fixture(scope="module")
def pool() -> Iterator[fiber.Pool]:
    with fiber.Pool(2) as p:
        p.map(abs, range(8))  # every worker up, its functions known
        yield p
    p.join()


def _map(p: fiber.Pool, a: list[Box]) -> Any:
    return p.map(double, a)


def _map_chunks(p: fiber.Pool, a: list[Box]) -> Any:
    return p.map(double, a, chunksize=3)


def _map_async(p: fiber.Pool, a: list[Box]) -> Any:
    return p.map_async(double, a, chunksize=1).get(120)


def _imap(p: fiber.Pool, a: list[Box]) -> Any:
    return list(p.imap(double, a))


def _imap_unordered(p: fiber.Pool, a: list[Box]) -> Any:
    return list(p.imap_unordered(double, a, chunksize=2))


def _starmap(p: fiber.Pool, a: list[Box]) -> Any:
    return p.starmap(add, [(x, x) for x in a])


def _starmap_async(p: fiber.Pool, a: list[Box]) -> Any:
    return p.starmap_async(add, [(x, x) for x in a]).get(120)


def _apply_async(p: fiber.Pool, a: list[Box]) -> Any:
    return [r.get(120) for r in [p.apply_async(double, (x,)) for x in a]]


def _apply(p: fiber.Pool, a: list[Box]) -> Any:
    return [p.apply(double, (x,)) for x in a]


CALLS: dict[str, Callable[[fiber.Pool, list[Box]], Any]] = {
    "map": _map, "map-chunks": _map_chunks, "map_async": _map_async, "imap": _imap,
    "imap_unordered": _imap_unordered, "starmap": _starmap,
    "starmap_async": _starmap_async, "apply_async": _apply_async, "apply": _apply,
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_returned_call_keeps_no_argument_nor_result(pool: fiber.Pool, call: str) -> None:
    # multiprocessing keeps none of them once the call has returned (0 of 10, and 0 of
    # 10 results once the program drops them); before, fiber kept the first task of
    # each worker line's last batch with its arguments (2-8 of 10) and the result
    # object of the function's last map with its values (10 of 10)
    for _ in range(2):  # the second time, with the function's time measured
        args = [Box(i) for i in range(10)]
        arg_refs = [weakref.ref(a) for a in args]
        out = CALLS[call](pool, args)
        assert sorted(b.value for b in out) == [2 * i for i in range(10)]
        out_refs = [weakref.ref(b) for b in out]
        del args, out
        assert (_alive(arg_refs), _alive(out_refs)) == (0, 0)


def test_a_dropped_async_result_object_is_freed(pool: fiber.Pool) -> None:
    results = [pool.map_async(double, [Box(1), Box(2)]), pool.apply_async(double, (Box(3),)),
               pool.starmap_async(add, [(Box(1), Box(2))])]
    for r in results:
        r.get(120)
    refs = [weakref.ref(r) for r in results]
    del results, r
    assert _alive(refs) == 0


def boxes_here(_: Any) -> int:
    """The Box objects alive in this worker (after a collection)."""
    gc.collect()
    return sum(isinstance(o, Box) for o in gc.get_objects())


def test_a_returned_call_keeps_no_argument_bound_in_its_function() -> None:
    # pool.map(functools.partial(evaluate, theta), seeds), the evolution strategies'
    # step: multiprocessing frees theta once the call returned and the partial is
    # dropped, in the parent and in its workers. Before, fiber's parent kept the last
    # 256 functions (and their pickles) and each worker every function it was ever
    # sent: a new theta per step grew every worker's memory without bound
    with fiber.Pool(1) as p:
        for _ in range(3):
            theta = Box(5)
            ref = weakref.ref(theta)
            assert p.map(functools.partial(add, theta), [Box(1), Box(2)],
                         chunksize=1)[1].value == 7
            assert p.apply_async(functools.partial(add, theta), (Box(3),)).get(120).value == 8
            del theta
            assert _alive([ref]) == 0
        # the worker forgets the functions the parent freed with its next batch
        assert p.map(boxes_here, range(2)) == [0, 0]
    p.join()


class Fatal(Box):
    """An argument whose task ends its worker the first time (``died`` is set then)."""

    def __init__(self, value: int, died: Any) -> None:
        super().__init__(value)
        self.died = died


def double_or_die_once(box: Box) -> Box:
    if isinstance(box, Fatal) and not box.died.is_set():
        box.died.set()
        os._exit(1)
    return Box(box.value * 2)


def test_a_map_that_lost_a_worker_keeps_no_argument_once_returned(pool: fiber.Pool) -> None:
    # the tasks a lost worker held are kept a while for its late results; once the map
    # has returned, none of them (and so no argument) is kept. Before, the last 64
    # lost workers' tasks were kept with their arguments (and their map's results)
    died = fiber.Event()
    args = [Box(i) for i in range(10)]
    args[3] = Fatal(3, died)
    refs = [weakref.ref(a) for a in args]
    out = pool.map(double_or_die_once, args, chunksize=1)
    assert [b.value for b in out] == [2 * i for i in range(10)]
    assert died.is_set()  # a worker was lost
    out_refs = [weakref.ref(b) for b in out]
    del args, out
    assert (_alive(refs), _alive(out_refs)) == (0, 0)


def nothing() -> None:
    pass


def test_ended_and_closed_processes_are_freed() -> None:
    # multiprocessing frees every one; before, fiber's list of ended children kept the
    # closed ones until the next start() or active_children() (20 of 20 at worst)
    n = 20 if os.environ.get("FIBER_BACKEND", "local") == "local" else 4
    procs = [fiber.Process(target=nothing) for _ in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    for p in procs[: n // 2]:
        p.close()
    refs = [weakref.ref(p) for p in procs]
    del procs, p
    # the closed ones, and the joined ones too: a joined child is in no list
    assert _alive(refs) == 0
