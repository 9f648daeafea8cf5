"""Large numpy arrays through Pipe and Queue by shared memory (fiber.shm): round
trips, zero-copy receive, no segment left in /dev/shm after a get, after a receiver is
killed, after an unread queue is garbage collected, and the bytes fallback when the
reader is (made to look like it is) on another host."""

from __future__ import annotations

import gc
import os
import time

import pytest

import fiber
from fiber.wire import serialization, shm

np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(shm.host_token() is None, reason="no usable /dev/shm")

MB = 2**20


def leftover() -> list[str]:
    """Segments sent to or by this process still in /dev/shm once its free pooled
    segments are gone and the ones of ended processes are swept (what a run would
    leave behind). Other processes' segments (concurrent runs) are not ours to judge."""
    gc.collect()
    shm.close_pool()
    shm.sweep()
    return shm.segments(os.getpid())


@pytest.fixture(autouse=True)
def clean_shm():
    before = leftover()
    assert before == [], f"segments left by an earlier test: {before}"
    yield
    # children are joined by the tests; whatever they left must be gone now
    assert leftover() == []


def arrays():
    return [np.arange(MB // 8, dtype=np.float64), np.full(16 * MB, 7, dtype=np.uint8),
            {"a": np.ones((512, 1024), dtype=np.float32), "b": np.zeros(3 * MB, np.int8),
             "small": np.arange(10)}]


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())


def pipe_echo(conn) -> None:
    while True:
        obj = conn.recv()
        if obj is None:
            conn.send(shm.used())
            return
        conn.send(obj)


def queue_echo(inbox, outbox) -> None:
    while True:
        obj = inbox.get()
        if obj is None:
            outbox.put(shm.used())
            return
        outbox.put(obj)


def test_pipe_round_trip_of_big_arrays():
    parent, child = fiber.Pipe()
    p = fiber.Process(target=pipe_echo, args=(child,))
    p.start()
    child.close()
    for _ in range(3):  # the pooled segments get reused
        for obj in arrays():
            parent.send(obj)
            assert same(parent.recv(), obj)
    parent.send(None)
    assert parent.recv() is True  # the child did use shared memory
    p.join(60)
    assert p.exitcode == 0


def test_queue_round_trip_of_big_arrays_zero_copy():
    inbox, outbox = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=queue_echo, args=(inbox, outbox))
    p.start()
    for obj in arrays():
        inbox.put(obj)
        got = outbox.get(timeout=60)
        assert same(got, obj)
    got["b"][:] = 5  # received arrays are writable
    inbox.put(None)
    assert outbox.get(timeout=60) is True
    p.join(60)
    assert p.exitcode == 0
    # a received array is backed by the mapping of the segment (no copy)
    q = fiber.Queue()
    q.put(np.arange(MB))
    got = q.get()
    assert got.base is not None and not got.flags.owndata
    assert got.sum() == np.arange(MB).sum()


def test_local_get_leaves_no_segment_and_recv_bytes_gets_the_pickle():
    a, b = fiber.Pipe()
    arr = np.arange(2 * MB, dtype=np.int32)
    a.send(arr)
    data = b.recv_bytes()  # bytes wanted: the plain message, inline
    assert same(serialization.loads(data), arr)
    q = fiber.JoinableQueue()
    q.put(arr)
    got = q.get()
    q.task_done()
    assert same(got, arr)
    del got


def holder(q, ready) -> None:
    """Take one array, keep it, say so, then wait to be killed."""
    kept = q.get()
    ready.put(int(kept.sum()))
    time.sleep(600)


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "one-off"])
def test_receiver_killed_while_holding_an_array(monkeypatch, pooled):
    if not pooled:
        monkeypatch.setattr(shm.pool, "POOL_SLOTS", 0)  # the sender's pool reads it
    q, ready = fiber.Queue(), fiber.Queue()
    arr = np.ones(4 * MB, dtype=np.uint8)
    for _ in range(3):
        q.put(arr)
    p = fiber.Process(target=holder, args=(q, ready))
    p.start()
    assert ready.get(timeout=60) == arr.sum()
    p.kill()
    p.join(30)
    assert p.exitcode is not None
    # the segment it held is free again (the kernel dropped its lock) or, one-off,
    # was unlinked when it opened it; the two others are still readable
    assert same(q.get(timeout=10), arr) and same(q.get(timeout=10), arr)


def test_unread_items_of_a_queue_sent_to_a_child_at_exit(run_script):
    """A queue sent to another process lives as long as its creator: its unread
    items' segments go when the creator exits (as do a killed child's)."""
    out = run_script("""
        import numpy as np
        import fiber
        from fiber.wire import shm

        def fill(q):
            for i in range(3):
                q.put(np.full(2**21, i, dtype=np.uint8))

        if __name__ == "__main__":
            q = fiber.Queue()
            q.put(np.ones(2**21, dtype=np.uint8))
            p = fiber.Process(target=fill, args=(q,))
            p.start()
            p.join()
            print(" ".join(shm.segments(__import__("os").getpid())))
    """)
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert len(names) == 4  # one of the parent's, three of the child's
    assert not set(names) & set(shm.segments())  # all gone when the parent exited


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "one-off"])
def test_unread_items_of_a_collected_queue(monkeypatch, pooled):
    if not pooled:
        monkeypatch.setattr(shm.pool, "POOL_SLOTS", 0)  # the sender's pool reads it
    q = fiber.Queue()
    for i in range(4):
        q.put(np.full(2 * MB, i, dtype=np.uint8))
    assert shm.segments(os.getpid())  # written to shared memory, waiting in the mailbox
    del q
    gc.collect()


def sender(q, count: int) -> None:
    for i in range(count):
        q.put(np.full(2 * MB, i, dtype=np.uint8))


def test_items_of_an_ended_sender_are_not_lost():
    q = fiber.Queue()
    p = fiber.Process(target=sender, args=(q, 5))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    shm.sweep()  # must not take the segments of items still in the queue
    assert [int(q.get(timeout=10)[0]) for _ in range(5)] == [0, 1, 2, 3, 4]


def other_host_echo(conn) -> None:
    shm.set_host_token(b"another host")
    pipe_echo(conn)


def test_fallback_to_bytes_for_a_reader_on_another_host():
    parent, child = fiber.Pipe()
    p = fiber.Process(target=other_host_echo, args=(child,))
    p.start()
    child.close()
    for obj in arrays():
        parent.send(obj)
        assert same(parent.recv(), obj)
    parent.send(None)
    assert parent.recv() is False  # that child never touched a segment
    p.join(60)
    assert p.exitcode == 0


def test_shared_memory_turned_off(run_script):
    out = run_script("""
        import numpy as np
        import fiber
        from fiber.wire import shm

        def echo(conn):
            conn.send(conn.recv())

        if __name__ == "__main__":
            a, b = fiber.Pipe()
            p = fiber.Process(target=echo, args=(b,))
            p.start()
            arr = np.arange(2**20)
            a.send(arr)
            assert (a.recv() == arr).all()
            p.join()
            print("used", shm.used(), shm.host_token())
    """, env={"_FIBER_SHM": "0"})
    assert out.returncode == 0, out.stderr
    assert "used False None" in out.stdout


def owner_of_a_queue(back, go) -> None:
    """Create a queue, hand it to the parent, end without reading it."""
    mine = fiber.Queue()
    back.put(mine)
    go.get(timeout=60)


@pytest.mark.parametrize("pooled", [True, False], ids=["pooled", "one-off"])
def test_items_sent_to_a_queue_of_a_child_that_ends_unread(monkeypatch, pooled):
    if not pooled:
        monkeypatch.setattr(shm.pool, "POOL_SLOTS", 0)  # the sender's pool reads it
    back, go = fiber.Queue(), fiber.Queue()
    p = fiber.Process(target=owner_of_a_queue, args=(back, go))
    p.start()
    theirs = back.get(timeout=60)
    for i in range(2):
        theirs.put(np.full(2 * MB, i, dtype=np.uint8))
    assert any(f"-{p.pid}-{os.getpid()}-" in n for n in shm.segments(os.getpid()))
    go.put(None)
    p.join(60)
    assert p.exitcode == 0
    deadline = time.monotonic() + 30  # join may return a moment before the pid is gone
    while shm.alive(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    shm.close_pool(dead_owners_only=True)
    shm.sweep()
    assert not any(f"-{p.pid}-" in n for n in shm.segments(os.getpid()))


def test_bytes_when_no_segment_can_be_made(monkeypatch, tmp_path):
    """Fakes a /dev/shm that cannot take the segment (a missing directory stands for a
    full or absent one): the message goes as bytes and arrives all the same."""
    monkeypatch.setattr(shm.segment, "DIRECTORY", str(tmp_path / "missing"))
    arr = np.arange(2 * MB)
    data = serialization.dumps(arr, lambda: os.getpid())
    assert not serialization.is_shared(data)
    q = fiber.Queue()
    q.put(arr)
    assert same(q.get(), arr)
