"""Pool.map over every kind of input, with real workers on the local backend."""

from __future__ import annotations

import fiber


def _square(x):
    return x * x


def test_map_over_every_kind_of_input_and_chunksize():
    """A list, tuple or range is chunked as it is (a range's chunks are ranges); any
    other iterable is read first; the results are the same for every chunk size,
    and a list changed after map_async returned does not change its results."""
    inputs = {"list": list(range(1001)), "tuple": tuple(range(1001)),
              "range": range(1001), "stepped range": range(-500, 1502, 2),
              "generator": (i for i in range(1001)), "empty": []}
    with fiber.Pool(2) as pool:
        for name, items in inputs.items():
            expected = [x * x for x in list(items)] if name != "generator" else [
                x * x for x in range(1001)]
            for chunksize in (None, 1, 7, 1000, 5000):
                if name == "generator":
                    items = (i for i in range(1001))
                assert pool.map(_square, items, chunksize) == expected, (name, chunksize)
        data = list(range(100))
        result = pool.map_async(_square, data, 10)
        data[:] = [0] * 100
        assert result.get(30) == [x * x for x in range(100)]


def test_imap_over_long_sequences_read_by_slices():
    """A list, tuple or range longer than the imap's window goes through the feeder,
    which reads it by slices: every result, in order (imap) or all of them
    (imap_unordered), at several chunk sizes."""
    from fiber.runtime.pool import feeder

    with fiber.Pool(2) as pool:
        for chunksize in (1, 1000):
            n = feeder.window(2, chunksize) * chunksize + 12_345  # past the window
            for items in (range(n), list(range(n)), tuple(range(n))):
                assert list(pool.imap(_square, items, chunksize)) == [
                    x * x for x in range(n)], (type(items), chunksize)
            got = sorted(pool.imap_unordered(_square, range(n), chunksize))
            assert got == [x * x for x in range(n)]
