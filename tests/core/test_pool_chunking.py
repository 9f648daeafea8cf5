"""The pool's chunking policy (fiber.runtime.pool.chunking), pinned.

Every number below was computed from the code BEFORE the policy moved into one module
(``Pool._chunks``/``_size_hint`` in pool.py, ``feeder.window``, the batch limits of
``scheduler.send_batch``): moving it must not change a chunk. Pure arithmetic, no pool.
"""

from __future__ import annotations

import pytest

from fiber.runtime.pool import chunking

# (items, workers, chunksize given) -> (chunksize, chunks, last chunk's size, items
# submitted under the lock at once)
MAPS = [
    ((0, 1, None), (1, 0, 0, 1024)),
    ((1, 1, None), (1, 1, 1, 1024)),
    ((7, 2, None), (1, 7, 1, 1024)),
    ((8, 2, None), (1, 8, 1, 1024)),
    ((9, 2, None), (2, 5, 1, 1024)),
    ((100, 4, None), (7, 15, 2, 1022)),
    ((1000, 4, None), (63, 16, 55, 1008)),
    ((1001, 4, None), (63, 16, 56, 1008)),
    ((10**6, 8, None), (31250, 32, 31250, 31250)),
    ((10**6, 1, None), (250000, 4, 250000, 250000)),
    ((50, 100, None), (1, 50, 1, 1024)),
    ((10, 3, 1), (1, 10, 1, 1024)),
    ((10, 3, 4), (4, 3, 2, 1024)),
    ((5000, 2, 3), (3, 1667, 2, 1023)),
    ((3000, 2, 2048), (2048, 2, 952, 2048)),
    ((10**5, 16, 5000), (5000, 20, 5000, 5000)),
]


@pytest.mark.parametrize(("given", "expected"), MAPS)
def test_map_chunks(given, expected):
    items, workers, chunksize = given
    size = chunking.map_chunksize(items, workers, chunksize)
    chunks = [min(size, items - i) for i in range(0, items, size)]
    assert (size, len(chunks), chunks[-1] if chunks else 0,
            chunking.submit_step(size)) == expected


def test_map_chunksize_is_checked_as_multiprocessing_s():
    with pytest.raises(ValueError, match="Chunksize must be 1\\+, not 0"):
        chunking.map_chunksize(10, 2, 0)
    with pytest.raises(TypeError):
        chunking.map_chunksize(10, 2, 2.0)


def test_map_workers():
    assert chunking.map_workers(4, None) == 4
    assert chunking.map_workers(0, None) == 1  # an adapting pool may have no worker
    assert chunking.map_workers(4, 16) == 16  # an adapting pool's maximum
    assert chunking.map_workers(4, 0) == 1


# (processes, chunksize, item bytes) -> chunks an imap keeps ahead
WINDOWS = [
    ((1, 1, 0), 8192), ((2, 1, 0), 8192), ((2, 100, 0), 256), ((2, 1000, 0), 256),
    ((64, 1, 0), 8192), ((4000, 1, 0), 16002), ((2, 1, 2**20 + 100), 63),
    ((2, 10, 10**9), 10), ((8, 5000, 0), 209),
]


@pytest.mark.parametrize(("given", "expected"), WINDOWS)
def test_imap_window(given, expected):
    assert chunking.window(*given) == expected


def test_batch_limits():
    # (tasks left in the queue, workers) -> tasks a batch takes after its first
    assert [chunking.batch_tasks(q, w) for q, w in
            [(1000, 1), (100, 4), (3, 2), (0, 1), (10**6, 1)]] \
        == [128, 12, 0, 0, 128]
    assert not chunking.goes_alone(1, None)
    assert not chunking.goes_alone(2047, 0.004)
    assert chunking.goes_alone(2048, None)  # a chunk this big goes alone
    assert chunking.goes_alone(1, 0.005)  # tasks this long are not batched


def test_least_batch_is_what_one_round_trip_runs():
    # (a task's seconds, a recall's round trip) -> tasks a batch takes after its first,
    # at least: none until both are measured, at most MAX_BATCH
    assert [chunking.least_batch(t, r) for t, r in
            [(None, 0.05), (0.001, None), (0.001, 0.05), (0.1, 0.05), (1e-6, 1.0)]] \
        == [0, 0, 50, 0, chunking.MAX_BATCH]
