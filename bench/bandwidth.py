"""Bandwidth of Pipe and Queue transfers of numpy arrays, against a memory copy.

The parent sends an array to a child process, which receives it (unpickling it
into a new array), drops it and answers with its size; the time from send to answer
gives GB/s. Each size is sent once untimed first (steady state: buffers, pools and
the allocator warmed up, for every contender alike). A plain ``numpy.copyto`` of the
same array is the physical bound of a copying transfer (fiber's shared-memory path
copies once, on the sender's side, and the receiver maps the pages).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np


def pipe_echo(conn: Any) -> None:
    """Child: answer every array received on ``conn`` with its size; stop on None."""
    while True:
        obj = conn.recv()
        if obj is None:
            return
        size = obj.nbytes
        del obj  # consumed: a receiver that keeps arrays would not be measuring transfers
        conn.send(size)


def queue_echo(inbox: Any, outbox: Any) -> None:
    """Child: answer every array taken from ``inbox`` with its size; stop on None."""
    while True:
        obj = inbox.get()
        if obj is None:
            return
        size = obj.nbytes
        del obj
        outbox.put(size)


def _repeats(nbytes: int, budget_bytes: int) -> int:
    return max(3, min(20, budget_bytes // max(nbytes, 1)))


def _samples(once: Any, nbytes: int, budget_mb: int, max_seconds: float | None) -> list[float]:
    """Durations of ``once()``: :func:`_repeats` of them, or fewer (at least 3) when
    they have taken ``max_seconds`` (quick modes: slow transfers get 3 samples, fast
    ones up to 20)."""
    samples: list[float] = []
    spent = 0.0
    for _ in range(_repeats(nbytes, budget_mb * 2**20)):
        if len(samples) >= 3 and max_seconds is not None and spent > max_seconds:
            break
        t0 = time.perf_counter()
        once()
        samples.append(time.perf_counter() - t0)
        spent += samples[-1]
    return samples


def memcpy(sizes_mb: list[int], budget_mb: int, max_seconds: float | None = None) -> dict:
    """GB/s of ``numpy.copyto`` per array size."""
    out = {}
    for mb in sizes_mb:
        src = np.ones(mb * 2**20, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        samples = _samples(lambda dst=dst, src=src: np.copyto(dst, src), src.nbytes, budget_mb,
                           max_seconds)
        out[f"copy/{mb}MB"] = src.nbytes / statistics.median(samples) / 1e9
    return out


def transfers(module: Any, sizes_mb: list[int], budget_mb: int,
              max_seconds: float | None = None) -> dict:
    """GB/s of Pipe and Queue transfers per array size, using ``module``'s
    Process/Pipe/Queue (multiprocessing or fiber); see :func:`_samples` for how many."""
    out: dict[str, float] = {}
    parent, child = module.Pipe()
    p = module.Process(target=pipe_echo, args=(child,))
    p.start()
    try:
        parent.send(np.ones(1024, dtype=np.uint8))
        parent.recv()
        for mb in sizes_mb:
            arr = np.ones(mb * 2**20, dtype=np.uint8)
            parent.send(arr)  # warm-up
            parent.recv()

            def pipe_once(arr=arr) -> None:
                parent.send(arr)
                assert parent.recv() == arr.nbytes

            samples = _samples(pipe_once, arr.nbytes, budget_mb, max_seconds)
            out[f"pipe/{mb}MB"] = arr.nbytes / statistics.median(samples) / 1e9
        parent.send(None)
        p.join(60)
    finally:
        if p.is_alive():
            p.terminate()
            p.join(10)
    inbox, outbox = module.Queue(), module.Queue()
    p = module.Process(target=queue_echo, args=(inbox, outbox))
    p.start()
    try:
        inbox.put(np.ones(1024, dtype=np.uint8))
        outbox.get(timeout=120)
        for mb in sizes_mb:
            arr = np.ones(mb * 2**20, dtype=np.uint8)
            inbox.put(arr)  # warm-up
            outbox.get(timeout=300)

            def queue_once(arr=arr) -> None:
                inbox.put(arr)
                assert outbox.get(timeout=300) == arr.nbytes

            samples = _samples(queue_once, arr.nbytes, budget_mb, max_seconds)
            out[f"queue/{mb}MB"] = arr.nbytes / statistics.median(samples) / 1e9
        inbox.put(None)
        p.join(60)
    finally:
        if p.is_alive():
            p.terminate()
            p.join(10)
    return out


def _send_host_token(conn: Any) -> None:
    """Child: send this process's shared-memory host token (None: not usable)."""
    from fiber.wire import shm

    conn.send(shm.host_token())
    conn.close()


def through_shared_memory(module: Any) -> dict:
    """Whether fiber's large transfers to a child went through shared memory: a child
    ``module.Process`` reports its host token; ``shm/same_host`` is 1.0 when it equals
    this process's (both on this host with shared memory on: the Pipe and Queue figures
    above did not cross a network), else 0.0."""
    from fiber.wire import shm

    parent, child = module.Pipe()
    p = module.Process(target=_send_host_token, args=(child,))
    p.start()
    try:
        if not parent.poll(120):
            raise TimeoutError("the child did not report its host token within 120 s")
        theirs = parent.recv()
        p.join(60)
    finally:
        if p.is_alive():
            p.terminate()
            p.join(10)
    mine = shm.host_token()
    return {"shm/same_host": 1.0 if mine is not None and theirs == mine else 0.0}
