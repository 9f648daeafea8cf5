"""fiber.sharedctypes against multiprocessing.sharedctypes: the same calls give the
same results; objects passed to fiber Processes (and through Queues, at any time) are
the same memory on this host, and used through their creator by a process with
``FIBER_SHARED_MEMORY=false`` (the path of processes of other hosts); the
documentation's examples print what multiprocessing prints; a killed creator fails
its remote holders promptly; no /dev/shm name outlives its creator.

Every test uses real processes and real shared memory; the "other host" path is the
real one, forced in a child by the ``shared_memory`` setting."""

from __future__ import annotations

import ctypes
import multiprocessing.sharedctypes as mp_sharedctypes
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import fiber
from fiber import sharedctypes
from fiber.errors import ConnectionLostError
from fiber.wire import shm

pytestmark = pytest.mark.timeout(300)


class Point(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("y", ctypes.c_double)]


def _normalize(text: str) -> str:
    text = re.sub(r"0x[0-9a-f]+", "0x?", text)
    return text.replace("multiprocessing.sharedctypes", "fiber.sharedctypes")


def exercise(module) -> list[str]:
    """Every public call of a sharedctypes module, as the texts of their results."""
    out = []
    rv = module.RawValue("d", 1.5)
    out += [repr(rv), repr(module.RawValue(ctypes.c_int)), repr(module.RawValue("c", b"x"))]
    ra = module.RawArray("i", [3, 1, 2])
    out += [repr(ra[:]), repr(ra[1:]), repr(len(ra)), repr(list(module.RawArray("h", 3)))]
    v = module.Value("d", 1.5)
    out += [repr(v), repr(v.value), repr(v.get_obj()), type(v).__name__]
    v.value = 2.25
    with v:
        v.value += 1
    out += [repr(v.value), repr(v.acquire()), repr(v.release())]
    a = module.Array("d", [1.0, 2.0, 3.0])
    out += [type(a).__name__, repr(a[:]), repr(a[::-1]), repr(a[-1]), repr(len(a))]
    a[0:2] = [5.0, 6.0]
    a[-1] = 7.0
    out += [repr(a[:]), repr(type(a.get_obj()).__mro__[1:])]
    with pytest.raises(IndexError) as err:
        a[3]
    out.append(repr(err.value))
    s = module.Array("c", b"hello world")
    out += [type(s).__name__, repr(s.value), repr(s.raw), repr(s[0]), repr(s[:5])]
    s.value = b"HELLO"
    out += [repr(s.value), repr(s.raw)]
    s.raw = b"abcdefghijk"
    out.append(repr(s.value))
    w = module.Array("u", "hi there")
    out += [repr(w.get_obj().value), repr(w[:2]), type(w).__name__]
    p = module.Value(Point, 1.5, -2.0)
    out += [type(p).__name__, repr(p.x), repr(p.y)]
    p.x = 3.0
    out.append(repr(p.get_obj().x))
    points = module.Array(Point, [(1.0, 2.0), (3.0, 4.0)])
    for q in points:
        q.x **= 2
    out.append(repr([(q.x, q.y) for q in points]))
    out += [repr(module.Value("i", 3, lock=False)), repr(module.Array("i", 2, lock=False)[:])]
    lock = fiber.RLock() if module is sharedctypes else mp_sharedctypes.get_context().RLock()
    shared_lock = module.Value("i", 1, lock=lock)
    out.append(repr(shared_lock.get_lock() is lock))
    for bad in ("yes", 3):
        with pytest.raises(AttributeError) as err:
            module.Value("i", 1, lock=bad)
        out.append(str(err.value))
    c = module.copy(rv)
    rv.value = 9.0
    out += [repr(c), repr(type(c).__name__)]
    sync = module.synchronized(module.RawArray("i", [1, 2]))
    out += [type(sync).__name__, repr(sync[:])]
    sp = module.synchronized(module.RawValue(Point, 1.0, 2.0))
    out += [type(sp).__name__, repr(sp.y)]
    with pytest.raises(AssertionError):
        module.synchronized(sync)
    return [_normalize(line) for line in out]


def test_same_calls_same_results_as_multiprocessing():
    assert exercise(sharedctypes) == exercise(mp_sharedctypes)


def test_raw_objects_are_ctypes_objects_over_shared_memory():
    a = sharedctypes.RawArray("d", 4)
    assert isinstance(a, ctypes.Array) and a._type_ is ctypes.c_double
    # private read: no API names the segment an object lives in; the test reads its bytes
    name = a._fiber_ref.buffer.name
    assert name in shm.state_names(os.getpid())
    a[2] = 7.5
    with open(os.path.join(shm.DIRECTORY, name), "rb") as f:
        assert f.read(32)[16:24] == bytes(ctypes.c_double(7.5))
    assert sharedctypes.shared_path(a) == "native"


def test_a_plain_ctypes_object_still_pickles_by_value():
    import pickle

    sharedctypes.RawValue("d", 1.0)  # registers c_double's reducer
    plain = pickle.loads(pickle.dumps(ctypes.c_double(2.5)))
    assert plain.value == 2.5 and getattr(plain, "_fiber_ref", None) is None


def test_a_wrapper_of_memory_that_is_not_shared_does_not_pickle():
    import pickle

    with pytest.raises(TypeError, match="not in shared memory"):
        pickle.dumps(sharedctypes.synchronized(ctypes.c_int(3)))


# -- across processes --------------------------------------------------------------------
def writer(value, array, string, points, raw, q) -> None:
    q.put([sharedctypes.shared_path(x) for x in (value, array, string, points, raw)])
    value.value += 40
    array[1] = -1.5
    array[2:4] = [8.0, 9.0]
    string.value = string.value.upper()
    for p in points:
        p.y = -p.y
    raw[0] = 42
    with value.get_lock():
        q.put(repr(value))
    q.put((repr(value.get_obj()), len(array), array[:], value.get_lock() is not None))


def _objects():
    return (sharedctypes.Value("i", 2), sharedctypes.Array("d", 4),
            sharedctypes.Array("c", b"abc"),
            sharedctypes.Array(Point, [(1.0, 2.0), (3.0, 4.0)]),
            sharedctypes.RawArray("q", 2))


def _check_written(objects) -> None:
    value, array, string, points, raw = objects
    assert value.value == 42
    assert array[:] == [0.0, -1.5, 8.0, 9.0]
    assert string.value == b"ABC"
    assert [(p.x, p.y) for p in points] == [(1.0, -2.0), (3.0, -4.0)]
    assert raw[:] == [42, 0]


@pytest.mark.parametrize("child_shared_memory", ["true", "false"])
def test_a_child_sees_and_makes_writes(monkeypatch, child_shared_memory):
    objects = _objects()
    q = fiber.Queue()
    # the child inherits the setting; this process has computed its host already
    monkeypatch.setenv("FIBER_SHARED_MEMORY", child_shared_memory)
    p = fiber.Process(target=writer, args=(*objects, q))
    p.start()
    path = "native" if child_shared_memory == "true" else "creator"
    assert q.get(timeout=60) == [path] * 5
    assert q.get(timeout=60) == "<Synchronized wrapper for c_int(42)>"
    assert q.get(timeout=60) == ("c_int(42)", 4, [0.0, -1.5, 8.0, 9.0], True)
    p.join(60)
    assert p.exitcode == 0
    _check_written(objects)


def reader(q, back) -> None:
    while True:
        item = q.get(timeout=60)
        if item is None:
            return
        back.put((sharedctypes.shared_path(item), item[:] if hasattr(item, "__len__") else item.value))
        item[0] = 99  # seen by the creator, whatever the path


@pytest.mark.parametrize("child_shared_memory", ["true", "false"])
def test_objects_travel_through_queues_at_any_time(monkeypatch, child_shared_memory):
    q, back = fiber.Queue(), fiber.Queue()
    monkeypatch.setenv("FIBER_SHARED_MEMORY", child_shared_memory)
    p = fiber.Process(target=reader, args=(q, back))
    p.start()
    path = "native" if child_shared_memory == "true" else "creator"
    for obj in (sharedctypes.RawArray("i", [1, 2]), sharedctypes.Array("i", [3, 4])):
        before = obj[:]
        q.put(obj)
        assert back.get(timeout=60) == (path, before)
        deadline = time.monotonic() + 30
        while obj[0] != 99 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert obj[0] == 99
    q.put(None)
    p.join(60)
    assert p.exitcode == 0


def add(counter, n) -> None:
    for _ in range(n):
        with counter.get_lock():
            counter.value += 1


def test_locked_increments_from_both_paths_add_up(monkeypatch):
    """Two children on shared memory and two through the creator increment one
    Value under its lock: no increment is lost."""
    counter = sharedctypes.Value("i", 0)
    procs = []
    for setting in ("true", "false", "true", "false"):
        monkeypatch.setenv("FIBER_SHARED_MEMORY", setting)
        procs.append(fiber.Process(target=add, args=(counter, 100)))
        procs[-1].start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert counter.value == 400


def creator(q, go) -> None:
    value = sharedctypes.Value("d", 2.5)
    q.put((os.getpid(), value, sharedctypes.RawArray("i", [7, 8])))
    go.get(timeout=120)


def _swept(pid: int) -> None:
    """A sweep removes the blocks of the killed creator ``pid``. join() returns when the
    job is known to have ended, and the kernel may still show the process for a moment
    after (state R, then a zombie until its parent reaps it), when a sweep must leave its
    blocks: the sweep is tried again, for up to 10 s (the first try failed so under
    load)."""
    deadline = time.monotonic() + 10
    while True:
        shm.sweep()
        if shm.state_names(pid) == [] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert shm.state_names(pid) == []


def test_a_killed_creator_fails_remote_holders_promptly(monkeypatch):
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=creator, args=(q, go))
    p.start()
    # this process: "another host" (the token it had is given back at the end)
    # (private names: monkeypatch gives back the state exactly, set_host_token has no undo)
    monkeypatch.setattr(shm.host, "_token", None)
    monkeypatch.setattr(shm.host, "_token_known", True)
    pid, value, array = q.get(timeout=60)
    assert sharedctypes.shared_path(value) == sharedctypes.shared_path(array) == "creator"
    assert value.value == 2.5 and array[:] == [7, 8]
    assert shm.state_names(pid)  # the creator's blocks exist
    p.kill()
    p.join(30)
    for operation in (lambda: value.value, lambda: array[0], lambda: value.get_lock()):
        t0 = time.monotonic()
        with pytest.raises(ConnectionLostError, match="created this shared object"):
            operation()
        assert time.monotonic() - t0 < 15
    _swept(pid)


def test_native_holders_keep_the_memory_of_a_killed_creator():
    q, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=creator, args=(q, go))
    p.start()
    pid, value, array = q.get(timeout=60)
    assert sharedctypes.shared_path(value) == "native"
    p.kill()
    p.join(30)
    _swept(pid)
    raw = value.get_obj()  # (its lock is the creator's too: gone with it)
    raw.value = 4.0  # as multiprocessing: the mapping stays
    array[1] = 9
    assert raw.value == 4.0 and array[:] == [7, 9]


# -- the documentation's examples, as scripts --------------------------------------------
VALUE_ARRAY_EXAMPLE = """
    from multiprocessing import Process, Value, Array

    def f(n, a):
        n.value = 3.1415927
        for i in range(len(a)):
            a[i] = -a[i]

    if __name__ == '__main__':
        num = Value('d', 0.0)
        arr = Array('i', range(10))

        p = Process(target=f, args=(num, arr))
        p.start()
        p.join()

        print(num.value)
        print(arr[:])
"""

SHAREDCTYPES_EXAMPLE = """
    from multiprocessing import Process, Lock
    from multiprocessing.sharedctypes import Value, Array
    from ctypes import Structure, c_double

    class Point(Structure):
        _fields_ = [('x', c_double), ('y', c_double)]

    def modify(n, x, s, A):
        n.value **= 2
        x.value **= 2
        s.value = s.value.upper()
        for a in A:
            a.x **= 2
            a.y **= 2

    if __name__ == '__main__':
        lock = Lock()

        n = Value('i', 7)
        x = Value(c_double, 1.0/3.0, lock=False)
        s = Array('c', b'hello world', lock=lock)
        A = Array(Point, [(1.875,-6.25), (-5.75,2.0), (2.375,9.5)], lock=lock)

        p = Process(target=modify, args=(n, x, s, A))
        p.start()
        p.join()

        print(n.value)
        print(x.value)
        print(s.value)
        print([(a.x, a.y) for a in A])
"""


def run_example(tmp_path, code: str, env: dict | None = None) -> tuple[str, int]:
    """Run ``code`` in a fresh interpreter; its output and pid."""
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, **(env or {})})
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert err == "", err  # no warning in an ordinary run
    return out, proc.pid


@pytest.mark.parametrize("example", [VALUE_ARRAY_EXAMPLE, SHAREDCTYPES_EXAMPLE],
                         ids=["Value-Array", "sharedctypes"])
@pytest.mark.parametrize("shared_memory", ["true", "false"])
def test_documentation_examples_print_what_multiprocessing_prints(tmp_path, example,
                                                                  shared_memory):
    expected, _ = run_example(tmp_path, example)
    assert expected.strip()
    fiber_code = example.replace("multiprocessing", "fiber")
    got, pid = run_example(tmp_path, fiber_code, {"FIBER_SHARED_MEMORY": shared_memory})
    assert got == expected
    assert shm.state_names(pid) == []
