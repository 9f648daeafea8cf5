"""Memory released when multiprocessing releases it, on the selected backend: once a
pool's call has returned (and its result object is dropped), nothing of fiber's refers
to the call's arguments, its tasks or its results; a process that ended and was closed
(or joined) is not kept by fiber. Checked with weak references, on every map flavour
and on ``apply_async``/``apply``, with the pool still running."""

from __future__ import annotations

import gc
import os
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
    gc.collect()
    return sum(ref() is not None for ref in refs)


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
