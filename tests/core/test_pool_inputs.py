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
