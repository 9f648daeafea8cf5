"""Results that cannot travel fail their own task, loudly and at once (issue #32).

* A result the worker cannot pickle fails its task with multiprocessing's
  ``MaybeEncodingError`` and the worker goes on, whatever ``repr`` of the result does
  (a deeply nested list makes ``repr`` raise ``RecursionError``).
* A result (or a task's exception) that the worker pickles but the parent cannot
  unpickle fails its task with ``fiber.errors.ResultUnpicklingError`` naming the
  function, the task's place in its map and the cause; the task is not run again, the
  other tasks of its batch are delivered, the worker is not counted as lost.

Real parts: a real Pool on the local backend, real pickling. What refuses to load in
the parent is a real ``__reduce__`` / ``__setstate__`` that raises when it runs in the
test's own process (``PARENT_PID``, set by a fixture), as a class missing or broken on
the parent's side would.
"""

from __future__ import annotations

import multiprocessing.pool
import os
import pickle
import re
import threading
import time

import pytest

import fiber
from fiber import errors

#: the pid of the test's process (the pool's parent); None in the workers
PARENT_PID: int | None = None

BAD = 3  # the input that returns what cannot travel
LIMIT = 15  # seconds a failing call may take before the test calls it a hang


@pytest.fixture(autouse=True)
def _parent_pid():
    global PARENT_PID
    PARENT_PID = os.getpid()
    yield
    PARENT_PID = None


def _refuse_in_parent(value: int) -> int:
    if os.getpid() == PARENT_PID:
        raise ValueError(f"value {value} refuses to load in the parent")
    return value


class ReducesToRaise:
    """Unpickled by calling :func:`_refuse_in_parent`, which raises in the parent."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __reduce__(self):
        return _refuse_in_parent, (self.value,)


class SetstateRaises:
    """Its ``__setstate__`` raises in the parent."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __setstate__(self, state):
        _refuse_in_parent(state["value"])
        self.__dict__.update(state)


class ErrorThatWillNotLoad(Exception):
    """An exception that unpickles in the worker (fiber checks that there) but not in
    the parent."""

    def __reduce__(self):
        return _make_error, (str(self),)


def _make_error(text: str) -> ErrorThatWillNotLoad:
    _refuse_in_parent(0)
    return ErrorThatWillNotLoad(text)


def bad_by_reduce(x: int):
    return ReducesToRaise(x) if x == BAD else x * 10


def bad_by_setstate(x: int):
    return SetstateRaises(x) if x == BAD else x * 10


def bad_pair(x: int, y: int):
    return bad_by_reduce(x + y)


def raise_unloadable(x: int):
    raise ErrorThatWillNotLoad(f"task {x} failed")


def deep(depth: int) -> list:
    """A list nested ``depth`` deep: pickle and repr both exceed the recursion limit."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def deep_or_plain(x: int):
    return deep(100_000) if x == BAD else x * 10


def _worker_pids(pool) -> set:
    return {w.process.pid for w in pool.stats().workers if w.process is not None}


def _check_pool_after(pool, pids_before: set) -> None:
    """The pool goes on with the same worker, none counted lost."""
    assert pool.map(abs, [-1, -2]) == [1, 2]
    assert _worker_pids(pool) == pids_before
    assert pool.stats().lost == 0


@pytest.mark.parametrize("func", [bad_by_reduce, bad_by_setstate])
def test_apply_async_get_raises_naming_the_task(func):
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        began = time.monotonic()
        with pytest.raises(pickle.UnpicklingError) as info:
            pool.apply_async(func, (BAD,)).get(LIMIT)
        assert time.monotonic() - began < 10
        exc = info.value
        assert isinstance(exc, errors.ResultUnpicklingError)
        text = str(exc)
        assert func.__name__ in text and f"args=({BAD},)" in text
        assert "refuses to load in the parent" in text
        assert isinstance(exc.__cause__, ValueError)
        assert pool.apply(func, (1,)) == 10
        _check_pool_after(pool, pids)


@pytest.mark.parametrize("chunksize", [1, 4])
def test_map_raises_naming_the_item(chunksize):
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        began = time.monotonic()
        with pytest.raises(errors.ResultUnpicklingError) as info:
            pool.map_async(bad_by_reduce, range(8), chunksize).get(LIMIT)
        assert time.monotonic() - began < 10
        assert "bad_by_reduce" in str(info.value)
        assert (f"item {BAD}" if chunksize == 1 else "items 0-3") in str(info.value)
        _check_pool_after(pool, pids)


def test_map_raises():
    """The blocking ``map`` raises too, within seconds (run on a thread, so that a hang
    fails the test instead of hanging it)."""
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        outcome: list = []

        def run():
            try:
                outcome.append(pool.map(bad_by_setstate, range(8), 1))
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                outcome.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(10)
        assert outcome, "map did not return within 10 s"
        assert isinstance(outcome[0], errors.ResultUnpicklingError)
        assert f"bad_by_setstate, item {BAD}" in str(outcome[0])
        _check_pool_after(pool, pids)


def test_starmap_raises_naming_the_item():
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        with pytest.raises(errors.ResultUnpicklingError, match=f"bad_pair.*item {BAD}"):
            pool.starmap_async(bad_pair, [(i, 0) for i in range(8)], 1).get(LIMIT)
        _check_pool_after(pool, pids)


@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_imap_delivers_the_others_and_raises_for_the_bad_one(method):
    """The other tasks of the batch (chunksize=1: the 8 tasks go in one batch to the
    one worker) are delivered; the bad one raises in its place."""
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        it = getattr(pool, method)(bad_by_reduce, range(8))
        got, failed = [], []
        began = time.monotonic()
        for _ in range(8):
            try:
                got.append(it.next(LIMIT))
            except errors.ResultUnpicklingError as exc:
                failed.append(str(exc))
        assert time.monotonic() - began < 10
        assert sorted(got) == [i * 10 for i in range(8) if i != BAD]
        assert len(failed) == 1 and f"item {BAD}" in failed[0]
        with pytest.raises(StopIteration):
            it.next(LIMIT)
        assert pool.stats().failed == 1
        _check_pool_after(pool, pids)


def test_exception_that_cannot_load_in_parent_fails_its_task():
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        with pytest.raises(errors.ResultUnpicklingError, match="raise_unloadable") as info:
            pool.apply_async(raise_unloadable, (5,)).get(LIMIT)
        assert "exception" in str(info.value)
        _check_pool_after(pool, pids)


def test_deep_result_is_maybe_encoding_error_and_worker_kept():
    """multiprocessing's shape: "Error sending result: '...'. Reason: '...'"."""
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        began = time.monotonic()
        with pytest.raises(multiprocessing.pool.MaybeEncodingError) as info:
            pool.apply_async(deep, (100_000,)).get(LIMIT)
        assert time.monotonic() - began < 10
        text = str(info.value)
        assert re.fullmatch(r"Error sending result: '\[\[\[.*\]\]\]'\. Reason: '.+'", text)
        assert "recursion" in text
        _check_pool_after(pool, pids)


def test_deep_result_in_a_batch_fails_alone():
    with fiber.Pool(1) as pool:
        pids = {pool.apply(os.getpid)}
        it = pool.imap(deep_or_plain, range(8))
        out = []
        for _ in range(8):
            try:
                out.append(it.next(LIMIT))
            except multiprocessing.pool.MaybeEncodingError:
                out.append("failed")
        assert out == [0, 10, 20, "failed", 40, 50, 60, 70]
        _check_pool_after(pool, pids)


def numpy_values(x: int):
    import numpy as np

    return [np.float64(x), np.arange(x), np.dtype("int32"), len]


def test_numpy_results_arrive_whole():
    np = pytest.importorskip("numpy")
    from fiber.runtime.pool.result_codec import decode, encode

    body = encode([(7, True, numpy_values(3)), (8, True, 1)])
    [(tid, ok, value), (tid2, _, plain)] = decode(memoryview(body))
    assert (tid, ok, tid2, plain) == (7, True, 8, 1)
    assert value[0] == np.float64(3) and list(value[1]) == [0, 1, 2]
    assert value[2] == np.dtype("int32") and value[3] is len
    with fiber.Pool(1) as pool:
        got = pool.map(numpy_values, range(1, 6), 1)
    assert [list(v[1]) for v in got] == [list(range(i)) for i in range(1, 6)]


def test_a_message_that_will_not_load_fails_only_the_tasks_it_cannot_load(run_script):
    """A message decoded where numpy cannot be imported (a real interpreter, numpy
    blocked in ``sys.modules``): the task whose result holds numpy's objects fails, the
    plain one after it is delivered."""
    pytest.importorskip("numpy")
    from fiber.runtime.pool.result_codec import encode

    body = encode([(7, True, numpy_values(3)), (8, True, 1)])
    out = run_script(f"""
        import sys
        sys.modules["numpy"] = None
        from fiber.runtime.pool.result_codec import Unloadable, decode
        items = decode(memoryview({body!r}))
        print([(tid, ok, type(v.exc).__name__ if isinstance(v, Unloadable) else v)
               for tid, ok, v in items])
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(7, False, 'ModuleNotFoundError'), (8, True, 1)]"


@pytest.mark.parametrize("count", [1, 2, 999, 1000, 1001, 2500])
def test_decode_names_exactly_the_results_that_will_not_load(count):
    """Messages of every size (pickle writes a list in batches of 1,000, and one item
    alone another way) with results that refuse to load at the edges of the batches,
    one object shared by two results (the second refers to the first's through the
    pickle's memo), and values that are tuples of three themselves: the results that
    hold a refusing object, and only they, come as Unloadable."""
    from fiber.runtime.pool.result_codec import Unloadable, decode, encode

    bad = {i for i in (0, 998, 999, 1000, 1999, count - 1) if i < count}
    shared = SetstateRaises(-1)
    results = []
    for i in range(count):
        if i in bad:
            value = (ReducesToRaise(i), i, [i]) if i % 2 else {"x": SetstateRaises(i)}
        elif i == 500 and count > 501:
            value = (1, shared, (2, 3, 4))
        elif i == 501 and count > 501:
            value = [shared]
        else:
            value = (i, (i, i, i), [(i, True, i)])
        results.append((10_000 + i, True, value))
    if count > 501:
        bad |= {500, 501}
    got = decode(memoryview(encode(results)))
    assert len(got) == count
    for i, (task_id, ok, value) in enumerate(got):
        assert task_id == 10_000 + i
        if i in bad:
            assert not ok and isinstance(value, Unloadable), i
            assert "refuses to load" in str(value.exc)
        else:
            assert ok and value == results[i][2], i


def test_results_only_cloudpickle_can_send_then_one_nothing_can(run_script):
    """Results of a class of the script's ``__main__`` (in the worker a class made by
    cloudpickle, which pickle cannot send), with a result that nothing can pickle among
    them and plain data after them: each arrives whole, and only the bad one fails, as
    ``MaybeEncodingError``."""
    out = run_script("""
        import dataclasses, threading
        import fiber

        @dataclasses.dataclass
        class Point:
            x: int
            extra: object = None

        def make(i):
            if i == 150:
                return Point(i, threading.Lock())
            return i if i > 250 else Point(i)

        if __name__ == "__main__":
            with fiber.Pool(2) as pool:
                pending = [pool.apply_async(make, (i,)) for i in range(300)]
                bad, good = [], 0
                for i, result in enumerate(pending):
                    try:
                        value = result.get(60)
                    except Exception as exc:
                        bad.append((i, type(exc).__name__))
                    else:
                        want = i if i > 250 else Point(i)
                        good += value == want
            print(bad, good)
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(150, 'MaybeEncodingError')] 299", out.stdout + out.stderr
