"""Value, Array, RawValue and RawArray shared with job-backed processes on the selected
backend: a child on the creator's host maps the same memory, one on another host (a
container, a node, a pod) uses the objects through their creator; both see and make
the same writes. Each test reports the path the child took."""

from __future__ import annotations

import ctypes

import pytest

import fiber
from fiber import sharedctypes

pytestmark = pytest.mark.timeout(300)


class Pair(ctypes.Structure):
    _fields_ = [("a", ctypes.c_int), ("b", ctypes.c_double)]


def _expected_path() -> str | None:
    """The path a child must take: native on the local backend, through the creator
    with the shared_memory setting off; elsewhere it depends on where the job runs."""
    if not fiber.get_config_value("shared_memory"):
        return "creator"
    return "native" if fiber.get_config_value("backend") == "local" else None


def work(value, array, raw, pair, q) -> None:
    q.put(sharedctypes.shared_path(value))
    for _ in range(50):
        with value.get_lock():
            value.value += 1
    array[:] = [x * 2 for x in array[:]]
    raw.value = b"done"
    pair.b = pair.a / 4


def test_value_and_array_across_processes(record_property):
    value = fiber.Value("i", 0)
    array = fiber.Array("d", [1.0, 2.0, 3.0])
    raw = fiber.RawArray("c", 8)
    pair = fiber.RawValue(Pair, 10, 0.0)
    q = fiber.Queue()
    procs = [fiber.Process(target=work, args=(value, array, raw, pair, q)) for _ in range(2)]
    for p in procs:
        p.start()
    paths = {q.get(timeout=120) for _ in procs}
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    print(f"sharedctypes path of the children: {sorted(paths)}")
    record_property("sharedctypes_path", ",".join(sorted(paths)))
    expected = _expected_path()
    assert paths <= {"native", "creator"}
    if expected is not None:
        assert paths == {expected}
    assert value.value == 100
    assert array[:] == [4.0, 8.0, 12.0]
    assert raw.value == b"done"
    assert (pair.a, pair.b) == (10, 2.5)


def report(obj, q) -> None:
    q.put((sharedctypes.shared_path(obj), repr(obj), obj[:], len(obj)))
    obj[0] = -obj[0]


def test_through_a_queue_and_back(record_property):
    array = fiber.Array("i", [5, 6])
    q, back = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=report_from_queue, args=(q, back))
    p.start()
    q.put(array)
    path, text, items, length = back.get(timeout=120)
    p.join(120)
    assert p.exitcode == 0
    print(f"sharedctypes path of the child: {path}")
    record_property("sharedctypes_path", path)
    assert text.startswith("<SynchronizedArray wrapper for <fiber.sharedctypes.c_int_Array_2")
    assert (items, length) == ([5, 6], 2)
    assert array[:] == [-5, 6]


def report_from_queue(q, back) -> None:
    report(q.get(timeout=120), back)
