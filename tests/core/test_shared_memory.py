"""fiber.shared_memory and fiber.managers.SharedMemoryManager against the standard
library's: the same calls give the same results and errors; blocks passed to fiber
Processes are the same memory; a process with ``FIBER_SHARED_MEMORY=false`` (as one of
another host) gets an error that says why; the documentation's examples print what
multiprocessing prints; nothing is left in /dev/shm. Real processes, real /dev/shm."""

from __future__ import annotations

import multiprocessing.shared_memory as mp_shared_memory
import os
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

import fiber
from fiber import shared_memory
from fiber.errors import ProcessError
from fiber.managers import SharedMemoryManager
from fiber.wire import shm

pytestmark = pytest.mark.timeout(300)


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join(shm.DIRECTORY, name.lstrip("/")))


def exercise(module) -> list[str]:
    """The calls of a shared_memory module, as the texts of their results (names
    replaced by NAME)."""
    out: list[str] = []
    a = module.SharedMemory(create=True, size=10)
    try:
        out += [type(a.buf).__name__, repr(len(a.buf)), repr(a.size)]
        a.buf[:4] = bytearray([22, 33, 44, 55])
        b = module.SharedMemory(a.name)
        out += [repr(bytes(b.buf[:5])), repr(b.size), repr(b).replace(a.name, "NAME")]
        b.buf[:5] = b"howdy"
        out.append(repr(bytes(a.buf[:5])))
        b.close()
        b.close()  # twice is fine
        with pytest.raises(FileExistsError):
            module.SharedMemory(a.name, create=True, size=10)
    finally:
        a.close()
        a.unlink()
    with pytest.raises(FileNotFoundError):
        a.unlink()
    with pytest.raises(FileNotFoundError):
        module.SharedMemory(a.name)
    for kwargs in ({"create": True}, {"create": True, "size": -1}, {}):
        with pytest.raises(ValueError) as err:
            module.SharedMemory(**kwargs)
        out.append(str(err.value))
    sl = module.ShareableList(["howdy", b"HoWdY", -273.154, 100, None, True, 42])
    try:
        out += [repr([type(x) for x in sl]), repr(sl[2]), repr(sl[-1]), repr(len(sl))]
        sl[2] = "dry ice"
        with pytest.raises(ValueError) as err:
            sl[2] = "larger than previously allocated storage space"
        out += [str(err.value), repr(sl.format), repr(sl.count(None)), repr(sl.index(100))]
        other = module.ShareableList(name=sl.shm.name)
        other[-1] = -1
        out += [repr(sl[-1]), repr(other).replace(sl.shm.name, "NAME")]
        again = pickle.loads(pickle.dumps(sl))
        again[0] = "x"
        out += [repr(sl[0]), type(again).__name__]
        other.shm.close()
        again.shm.close()
    finally:
        sl.shm.close()
        sl.shm.unlink()
    return out


def test_same_calls_same_results_as_multiprocessing():
    assert exercise(shared_memory) == exercise(mp_shared_memory)


def test_a_created_block_is_named_for_the_sweep():
    block = shared_memory.SharedMemory(create=True, size=16)
    try:
        assert block.name in shm.state_names(os.getpid())
    finally:
        block.close()
        block.unlink()
    assert not _exists(block.name)


def writer(block, items, q) -> None:
    block.buf[:3] = b"abc"
    items[0] = "changed"
    items[1] = items[1] * 2
    q.put(bytes(block.buf[3:6]))


def test_a_child_uses_the_same_memory():
    block = shared_memory.SharedMemory(create=True, size=8)
    items = shared_memory.ShareableList(["initial", 21])
    try:
        block.buf[3:6] = b"xyz"
        q = fiber.Queue()
        p = fiber.Process(target=writer, args=(block, items, q))
        p.start()
        assert q.get(timeout=60) == b"xyz"
        p.join(60)
        assert p.exitcode == 0
        assert bytes(block.buf[:3]) == b"abc"
        assert list(items) == ["changed", 42]
    finally:
        for b in (block, items.shm):
            b.close()
            b.unlink()


def receiver(q, back, n) -> None:
    for _ in range(n):
        try:
            q.get(timeout=60)
        except FileNotFoundError as exc:
            back.put(str(exc))
        else:
            back.put("attached")


def test_another_host_gets_an_error_that_says_why(monkeypatch):
    block = shared_memory.SharedMemory(create=True, size=8)
    items = shared_memory.ShareableList([1])
    try:
        q, back = fiber.Queue(), fiber.Queue()
        monkeypatch.setenv("FIBER_SHARED_MEMORY", "false")  # the child's setting
        p = fiber.Process(target=receiver, args=(q, back, 2))
        p.start()
        for obj in (block, items):
            q.put(obj)
            message = back.get(timeout=60)
            assert "another host" in message and "Queue" in message, message
        p.join(60)
        assert p.exitcode == 0
    finally:
        for b in (block, items.shm):
            b.close()
            b.unlink()


def test_a_block_nobody_unlinked_goes_with_its_creator(run_script):
    out = run_script("""
        from fiber import shared_memory
        kept = shared_memory.SharedMemory(create=True, size=8)
        done = shared_memory.SharedMemory(create=True, size=8)
        done.close()
        done.unlink()
        print(kept.name)
    """)
    assert out.returncode == 0, out.stderr
    name = out.stdout.strip()
    assert not _exists(name)
    assert "was not unlinked" in out.stderr and name in out.stderr
    assert out.stderr.count("was not unlinked") == 1


# -- SharedMemoryManager ---------------------------------------------------------------
def test_manager_unlinks_what_it_made_at_shutdown():
    smm = SharedMemoryManager()
    with pytest.raises(ProcessError):
        smm.SharedMemory(8)
    smm.start()
    with pytest.raises(ProcessError, match="Already started"):
        smm.start()
    block = smm.SharedMemory(size=128)
    sl = smm.ShareableList("alpha")
    assert block.size == 128 and list(sl) == ["a", "l", "p", "h", "a"]
    names = [block.name, sl.shm.name]
    assert all(_exists(n) for n in names)
    smm.shutdown()
    assert not any(_exists(n) for n in names)
    smm.shutdown()  # twice is fine
    with pytest.raises(ProcessError, match="shut down"):
        smm.start()
    block.close()
    sl.shm.close()


def test_manager_as_context_manager():
    with SharedMemoryManager() as smm:
        sl = smm.ShareableList(range(4))
        name = sl.shm.name
        assert _exists(name)
    assert not _exists(name)
    sl.shm.close()


# -- the documentation's examples, as scripts ----------------------------------------------
SHARED_MEMORY_EXAMPLE = """
    from multiprocessing import shared_memory
    shm_a = shared_memory.SharedMemory(create=True, size=10)
    print(type(shm_a.buf))
    buffer = shm_a.buf
    print(len(buffer))
    buffer[:4] = bytearray([22, 33, 44, 55])  # Modify multiple at once
    buffer[4] = 100                           # Modify single byte at a time
    # Attach to an existing shared memory block
    shm_b = shared_memory.SharedMemory(shm_a.name)
    import array
    print(array.array('b', shm_b.buf[:5]))  # Copy the data into a new array.array
    shm_b.buf[:5] = b'howdy'  # Modify via shm_b using bytes
    print(bytes(shm_a.buf[:5]))      # Access via shm_a
    shm_b.close()   # Close each SharedMemory instance
    shm_a.close()
    shm_a.unlink()  # Call unlink only once to release the shared memory
"""

NUMPY_EXAMPLE = """
    # In the first Python interactive shell
    import numpy as np
    a = np.array([1, 1, 2, 3, 5, 8])  # Start with an existing NumPy array
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=a.nbytes)
    # Now create a NumPy array backed by shared memory
    b = np.ndarray(a.shape, dtype=a.dtype, buffer=shm.buf)
    b[:] = a[:]  # Copy the original data into shared memory
    print(repr(b))
    print(type(b))
    print(type(a))
    # In either the same shell or a new Python shell on the same machine
    import numpy as np
    from multiprocessing import shared_memory
    # Attach to the existing shared memory block
    existing_shm = shared_memory.SharedMemory(name=shm.name)
    # Note that a.shape is (6,) and a.dtype is np.int64 in this example
    c = np.ndarray((6,), dtype=np.int64, buffer=existing_shm.buf)
    print(repr(c))
    c[-1] = 888
    print(repr(c))
    # Back in the first Python interactive shell, b reflects this change
    print(repr(b))
    # Clean up from within the second Python shell
    del c  # Unnecessary; merely emphasizing the array is no longer used
    existing_shm.close()
    # Clean up from within the first Python shell
    del b  # Unnecessary; merely emphasizing the array is no longer used
    shm.close()
    shm.unlink()  # Free and release the shared memory block at the very end
"""

SHAREABLE_LIST_EXAMPLE = """
    from multiprocessing import shared_memory
    a = shared_memory.ShareableList(['howdy', b'HoWdY', -273.154, 100, None, True, 42])
    print([ type(entry) for entry in a ])
    print(a[2])
    a[2] = -78.5
    print(a[2])
    a[2] = 'dry ice'  # Changing data types is supported as well
    print(a[2])
    try:
        a[2] = 'larger than previously allocated storage space'
    except ValueError as exc:
        print(exc)
    print(a[2])
    print(len(a))
    print(a.count(None))
    a.shm.close()
    a.shm.unlink()
    del a  # Use of a ShareableList after call to unlink() is unsupported

    b = shared_memory.ShareableList(range(5))         # In a first process
    c = shared_memory.ShareableList(name=b.shm.name)  # In a second process
    print(str(c).replace(b.shm.name, "NAME"))
    c[-1] = -999
    print(b[-1])
    b.shm.close()
    c.shm.close()
    c.shm.unlink()

    import pickle
    sl = shared_memory.ShareableList(range(10))
    print(list(sl))
    deserialized_sl = pickle.loads(pickle.dumps(sl))
    print(str(deserialized_sl).replace(sl.shm.name, "NAME"))
    deserialized_sl[0] = -1
    deserialized_sl[1] = -2
    print(str(sl).replace(sl.shm.name, "NAME"))
    deserialized_sl.shm.close()
    sl.shm.close()
    sl.shm.unlink()
"""

MANAGER_EXAMPLE = """
    from multiprocessing import Process
    from multiprocessing.managers import SharedMemoryManager

    def do_work(sl, start, stop):
        for i in range(start, stop):
            sl[i] = i * i

    if __name__ == '__main__':
        smm = SharedMemoryManager()
        smm.start()  # Start the process that manages the shared memory blocks
        sl = smm.ShareableList(range(4))
        print(str(sl).replace(sl.shm.name, "NAME"))
        raw_shm = smm.SharedMemory(size=128)
        another_sl = smm.ShareableList('alpha')
        print(str(another_sl).replace(another_sl.shm.name, "NAME"))
        smm.shutdown()  # Calls unlink() on sl, raw_shm, and another_sl

        with SharedMemoryManager() as smm:
            sl = smm.ShareableList(range(2000))
            # Divide the work among two processes, storing partial results in sl
            p1 = Process(target=do_work, args=(sl, 0, 1000))
            p2 = Process(target=do_work, args=(sl, 1000, 2000))
            p1.start()
            p2.start()  # A multiprocessing.Pool might be more efficient
            p1.join()
            p2.join()   # Wait for all work to complete in both processes
            total_result = sum(sl)  # Consolidate the partial results now in sl
        print(total_result)
"""


def run_example(tmp_path, code: str) -> tuple[str, str, int]:
    script = tmp_path / "example.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    return out, err, proc.pid


@pytest.mark.parametrize("example", [SHARED_MEMORY_EXAMPLE, NUMPY_EXAMPLE,
                                     SHAREABLE_LIST_EXAMPLE, MANAGER_EXAMPLE],
                         ids=["SharedMemory", "numpy", "ShareableList", "manager"])
def test_documentation_examples_print_what_multiprocessing_prints(tmp_path, example):
    expected, _, _ = run_example(tmp_path, example)
    assert expected.strip()
    code = re.sub(r"\bmultiprocessing\b", "fiber", example)
    got, err, pid = run_example(tmp_path, code)
    assert got == expected
    assert err == ""  # no warning
    assert shm.state_names(pid) == []
