"""Queue, SimpleQueue, JoinableQueue and Pipe shared between job-backed processes on
the selected backend."""

from __future__ import annotations

import os
import queue
import time

import pytest

import fiber


def _double_all(inq, outq):
    while True:
        item = inq.get()
        if item is None:
            break
        outq.put(item * 2)


def _joinable_consumer(q, results):
    while True:
        item = q.get()
        results.put(item + 1)
        q.task_done()


def _echo(conn):
    while True:
        try:
            data = conn.recv_bytes()
        except EOFError:
            break
        conn.send_bytes(data)
    conn.close()


def _send_array(conn, n):
    import numpy as np

    conn.send(np.arange(n, dtype=np.float64))
    conn.send_bytes(b"raw-bytes")
    conn.close()


def _simple_put(q, n):
    for i in range(n):
        q.put(i)


def test_queue_many_writers_many_readers():
    inq, outq = fiber.Queue(), fiber.Queue()
    workers = [fiber.Process(target=_double_all, args=(inq, outq)) for _ in range(3)]
    for w in workers:
        w.start()
    for i in range(200):
        inq.put(i)
    for _ in workers:
        inq.put(None)
    results = sorted(outq.get(timeout=120) for _ in range(200))
    assert results == [2 * i for i in range(200)]
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    with pytest.raises(queue.Empty):
        outq.get(timeout=0.2)


def test_queue_timeouts_and_bounds():
    q = fiber.Queue(maxsize=2)
    q.put(1)
    q.put_nowait(2)
    assert q.full() and q.qsize() == 2
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.1)
    assert q.get() == 1 and q.get_nowait() == 2
    started = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 5
    assert q.empty()
    q.close()
    with pytest.raises(ValueError):
        q.put(1)


def test_simple_queue_from_children():
    q = fiber.SimpleQueue()
    procs = [fiber.Process(target=_simple_put, args=(q, 50)) for _ in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get() for _ in range(100))
    assert got == sorted(list(range(50)) * 2)
    for p in procs:
        p.join(60)
    assert q.empty()


def test_joinable_queue_join_waits_for_task_done():
    q, results = fiber.JoinableQueue(), fiber.Queue()
    p = fiber.Process(target=_joinable_consumer, args=(q, results), daemon=True)
    p.start()
    for i in range(20):
        q.put(i)
    q.join()  # returns only after 20 task_done() calls in the child
    assert sorted(results.get(timeout=10) for _ in range(20)) == list(range(1, 21))
    with pytest.raises(ValueError):
        q.task_done()
    p.terminate()
    p.join(60)


def test_pipe_round_trip_and_eof():
    parent, child = fiber.Pipe()
    p = fiber.Process(target=_echo, args=(child,))
    p.start()
    child.close()  # the usual idiom: the child's copy is now the only one
    for obj in ["text", 42, {"nested": [1, 2]}]:
        parent.send(obj)
        assert parent.recv() == obj
    parent.send_bytes(b"0123456789", 2, 5)
    assert parent.recv_bytes() == b"23456"
    parent.send_bytes(b"x" * 100)
    with pytest.raises(OSError):
        parent.recv_bytes(maxlength=10)  # too long: the handle is closed, as in mp
    parent = None
    p.join(60)
    assert p.exitcode == 0


def test_pipe_eof_when_child_exits_and_large_arrays():
    pytest.importorskip("numpy")
    reader, writer = fiber.Pipe(duplex=False)
    n = 2_000_000  # 16 MB
    p = fiber.Process(target=_send_array, args=(writer, n))
    p.start()
    writer.close()
    arr = reader.recv()
    assert arr.shape == (n,) and arr[-1] == n - 1
    arr[0] = 5  # a receiver gets a writable array, as with multiprocessing
    buf = bytearray(4)
    with pytest.raises(fiber.BufferTooShort):
        reader.recv_bytes_into(buf)
    with pytest.raises(EOFError):
        reader.recv()
    p.join(60)
    with pytest.raises(OSError):
        writer.send(1)


def test_pipe_local_semantics():
    a, b = fiber.Pipe()
    a.send(1)
    assert b.poll() and b.recv() == 1
    assert not b.poll(0.1)
    b.close()
    with pytest.raises(BrokenPipeError):
        a.send(2)
    with pytest.raises(EOFError):
        a.recv()
    with pytest.raises(OSError):
        b.recv()


def _use_nested(box):
    box["queue"].put(("via", box["name"]))
    box["pipe"].send("pipe too")


def test_queues_and_pipes_inside_other_objects():
    q = fiber.Queue()
    a, b = fiber.Pipe()
    p = fiber.Process(target=_use_nested, args=({"queue": q, "pipe": b, "name": "dict"},))
    p.start()
    assert q.get(timeout=120) == ("via", "dict")
    assert a.recv() == "pipe too"
    p.join(60)


def _die_at_once(conn):
    os._exit(3)


def test_pipe_reader_gets_eof_when_child_dies_without_using_its_end():
    reader, writer = fiber.Pipe(duplex=False)
    p = fiber.Process(target=_die_at_once, args=(writer,))
    p.start()
    writer.close()
    p.join(120)
    assert p.exitcode == 3
    assert reader.poll(30)
    with pytest.raises(EOFError):
        reader.recv()
