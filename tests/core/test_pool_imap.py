"""Pool.imap/imap_unordered read their input lazily (fiber.runtime.pool.feeder):
infinite inputs, the bounded read-ahead, an input that raises (compared with
multiprocessing's own Pool), chunk ordering, and the ends (close, terminate, a loop left
with break) without a hang or a thread left behind."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import fiber
from fiber.runtime.pool import feeder, results


def square(x):
    return x * x


def jittery_square(x):
    time.sleep(random.random() * 0.003)
    return x * x


def fail_on_five(x):
    if x == 5:
        raise ValueError("five")
    return x


class Counting:
    """An input that counts the items pulled from it (``n`` items, or endless)."""

    def __init__(self, n: int | None = None) -> None:
        self.pulled = 0
        self.n = n

    def __iter__(self):
        for i in itertools.count() if self.n is None else range(self.n):
            self.pulled += 1
            yield i


def broken_input(n):
    yield from range(n)
    raise KeyError("input broke")


def outcomes(it):
    """Every value and exception an imap iterator yields, as comparable tuples."""
    out = []
    while True:
        try:
            out.append(next(it))
        except StopIteration:
            return out
        except Exception as exc:  # noqa: BLE001 - recorded for comparison
            out.append((type(exc).__name__, exc.args))


@pytest.fixture(scope="module")
def pool():
    p = fiber.Pool(2)
    yield p
    p.terminate()
    p.join()


def _feeders():
    return [t for t in threading.enumerate() if t.name == "fiber-pool-feeder"]


def test_infinite_input(pool):
    it = pool.imap(square, itertools.count())
    assert [next(it) for _ in range(300)] == [x * x for x in range(300)]
    un = pool.imap_unordered(square, itertools.count(), chunksize=7)
    got = [next(un) for _ in range(300)]
    assert len(set(got)) == 300 and all(int(v ** 0.5) ** 2 == v for v in got)
    del it, un  # dropped iterators: their feeders stop reading
    deadline = time.monotonic() + 10
    while _feeders() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _feeders()
    assert pool.stats().queued == 0 or pool.map(square, range(3)) == [0, 1, 4]


@pytest.mark.parametrize("method,chunksize", [("imap", 1), ("imap", 10),
                                              ("imap_unordered", 1),
                                              ("imap_unordered", 10)])
def test_read_ahead_is_bounded(pool, method, chunksize):
    """A slow reader: the input is pulled at most a window ahead of what was read."""
    source = Counting(10**6)
    it = getattr(pool, method)(square, source, chunksize=chunksize)
    bound = feeder.window(pool.processes, chunksize) * chunksize
    assert bound < 10**5
    read = 0
    most_ahead = 0
    for _ in range(40):
        next(it)
        read += 1
        time.sleep(0.01)
        most_ahead = max(most_ahead, source.pulled - read)
    # the window, plus the chunk being handed out from the iterator's buffer
    assert most_ahead <= bound + max(chunksize, results.BUFFER), (most_ahead, bound)
    assert source.pulled >= read


def test_big_items_are_read_fewer_ahead(pool):
    """Items of a megabyte: the window holds what READ_AHEAD_BYTES does, not 8,192."""
    pulled = []

    def big():
        for i in range(10**5):
            pulled.append(i)
            yield bytes(2**20)

    it = pool.imap(len, big())
    bound = feeder.window(pool.processes, 1, 2**20 + 100)
    assert bound < 200
    for _ in range(20):
        assert next(it) == 2**20
        time.sleep(0.02)
    assert len(pulled) - 20 <= bound + results.BUFFER, (len(pulled), bound)


@pytest.mark.parametrize("chunksize", [1, 3])
@pytest.mark.parametrize("method", ["imap", "imap_unordered"])
def test_input_that_raises_is_reported_as_multiprocessing_does(pool, method, chunksize):
    """The results read before the input's exception, then the exception from
    next() (the items of a chunk it interrupted are not run), then StopIteration:
    compared with multiprocessing's Pool running the same calls. (multiprocessing's
    imap_unordered with chunks ends at the exception, which may overtake results and
    lose them; fiber's raises it after every result read before it: the same outcomes
    as imap's, in completion order.)"""

    def cases():
        return [broken_input(7), broken_input(0), 5, iter(range(4))]

    with multiprocessing.get_context("fork").Pool(2) as mp_pool:
        expected = [outcomes(mp_pool.imap(square, case, chunksize)) for case in cases()]
        mp_unordered = [outcomes(mp_pool.imap_unordered(square, case, chunksize))
                        for case in cases()]
    got = [outcomes(getattr(pool, method)(square, case, chunksize)) for case in cases()]
    assert got[0][-1] == ("KeyError", ("input broke",))
    if method == "imap_unordered":
        for mp_got, exp in zip(mp_unordered, expected, strict=True):
            assert all(x in exp for x in mp_got)
        expected = [sorted(e, key=repr) for e in expected]
        got = [sorted(g, key=repr) for g in got]
    assert got == expected


def test_chunks_keep_their_order(pool):
    items = list(range(2000))
    assert list(pool.imap(jittery_square, iter(items), chunksize=7)) == [
        x * x for x in items]
    # a sequence longer than the window goes through the feeder too
    assert list(pool.imap(square, range(50_000), chunksize=13)) == [
        x * x for x in range(50_000)]
    assert sorted(pool.imap_unordered(jittery_square, iter(items), chunksize=9)) == [
        x * x for x in items]


def test_next_and_for_loops_share_the_iterator(pool):
    """``for x in it`` runs a generator over the same state as ``next(it)``: they may
    alternate, and an exception ends a loop, not the iterator."""
    it = pool.imap(square, iter(range(300)), chunksize=7)
    got = [next(it) for _ in range(10)]
    for value in it:
        got.append(value)
        if len(got) == 30:
            break
    got += [it.next(timeout=30) for _ in range(5)]
    got += list(it)
    assert got == [x * x for x in range(300)]
    failing = pool.imap(fail_on_five, range(8), chunksize=2)
    with pytest.raises(ValueError, match="five"):
        for _ in failing:
            pass
    with pytest.raises(ValueError, match="five"):
        next(failing)  # item 5: its chunk (4, 5) failed as a whole
    assert list(failing) == [6, 7]


def test_a_failed_chunk_fails_each_of_its_items(pool):
    got = outcomes(pool.imap(fail_on_five, iter(range(9)), chunksize=3))
    assert got == [0, 1, 2, ("ValueError", ("five",)), ("ValueError", ("five",)),
                   ("ValueError", ("five",)), 6, 7, 8]


def test_next_with_timeout_before_the_input_is_read(pool):
    def slow_input():
        time.sleep(1.0)
        yield 3

    it = pool.imap(square, slow_input())
    with pytest.raises(fiber.TimeoutError):
        it.next(timeout=0.1)
    assert it.next(timeout=30) == 9
    with pytest.raises(StopIteration):
        it.next(timeout=30)


def test_close_then_join_runs_a_finite_input_nobody_reads_yet():
    """close() does not cut an imap's input short: join() returns once every item
    ran, and the results are all there afterwards."""
    p = fiber.Pool(2)
    source = Counting(20_000)
    it = p.imap(square, source, chunksize=3)
    p.close()
    p.join()
    assert source.pulled == 20_000
    assert list(it) == [x * x for x in range(20_000)]
    assert not _feeders()


def test_terminate_while_an_infinite_imap_is_read():
    """The iterator raises ValueError after what was submitted; no feeder is left."""
    p = fiber.Pool(2)
    it = p.imap(square, itertools.count(), chunksize=5)
    assert [next(it) for _ in range(100)] == [x * x for x in range(100)]
    p.terminate()
    p.join()
    assert not _feeders()
    with pytest.raises(ValueError):
        for _ in range(10**6):
            next(it)


PROGRAM = textwrap.dedent("""
    import itertools, sys, threading, fiber

    def square(x):
        return x * x

    if __name__ == "__main__":
        how = sys.argv[1]
        p = fiber.Pool(2)
        if how == "break-close":
            pulled = []

            def counting():
                for i in itertools.count():
                    pulled.append(i)
                    yield i

            for n, value in enumerate(p.imap(square, counting())):
                if n == 2_000:
                    break
            p.close()
            p.join()
            print("pulled", len(pulled))
        elif how == "held-terminate":
            it = p.imap_unordered(square, itertools.count(), chunksize=4)
            [next(it) for _ in range(500)]
            p.terminate()
            p.join()
        elif how == "with":
            with fiber.Pool(2) as p2:
                for value in p2.imap(square, itertools.count(), chunksize=100):
                    if value > 10**8:
                        break
            p.close()
            p.join()
        else:  # exit while an imap is being read, with no close or terminate
            it = p.imap(square, itertools.count())
            [next(it) for _ in range(500)]
        left = [t.name for t in threading.enumerate() if t.name == "fiber-pool-feeder"]
        print("feeders left", left if how != "exit" else [])
""")


@pytest.mark.parametrize("how", ["break-close", "held-terminate", "with", "exit"])
def test_program_ends_promptly(tmp_path, how):
    script = tmp_path / "imap_end.py"
    script.write_text(PROGRAM)
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script), how], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "feeders left []" in done.stdout, done.stdout
    if how == "break-close":  # the dropped iterator stopped the reading, close or not
        pulled = int(done.stdout.split("pulled ")[1].split()[0])
        assert pulled <= 2_001 + feeder.window(2, 1) + results.BUFFER, pulled
    assert done.stderr == ""
    assert time.monotonic() - start < 60
