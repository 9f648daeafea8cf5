"""The loop a Pool worker runs in its job.

It keeps two requests outstanding on the pool's channel, so that while it runs one
batch of tasks the next batch is already on its way; each request carries the results
of the batch it just finished. A ``STOP`` answer retires a request line; the worker
exits when both are retired (pool closed, shrunk, or ``maxtasksperchild`` reached).
"""

from __future__ import annotations

import collections
import pickle
import struct

from fiber import serialization, transport

READY = b"R"
RESULTS = b"D"
STOP = b"S"
TASKS = b"T"
_WORKER = struct.Struct("<Q")

CALL, MAP, STARMAP = 0, 1, 2


def run_batch(batch, funcs: dict) -> list:
    """Run ``[(task_id, func_id, func_bytes, kind, payload), ...]``; returns
    ``[(task_id, ok, value), ...]`` where a failure's value is a packed exception."""
    results = []
    for task_id, func_id, func_bytes, kind, payload in batch:
        if func_bytes is not None:
            funcs[func_id] = serialization.loads_code(func_bytes)
        func = funcs[func_id]
        try:
            if kind == CALL:
                args, kwds = payload
                value = func(*args, **kwds)
            elif kind == MAP:
                value = [func(x) for x in payload]
            else:
                value = [func(*x) for x in payload]
            results.append((task_id, True, value))
        except BaseException as exc:  # noqa: BLE001 - every task failure goes back
            results.append((task_id, False, serialization.pack_exception(exc)))
    return results


def encode_results(worker_id: int, results: list) -> bytes:
    try:
        return RESULTS + _WORKER.pack(worker_id) + serialization.dumps(results)
    except pickle.PicklingError:
        safe = []
        for task_id, ok, value in results:
            try:
                serialization.dumps(value)
                safe.append((task_id, ok, value))
            except pickle.PicklingError as exc:
                error = _unpicklable_result(exc, value)
                safe.append((task_id, False, serialization.pack_exception(error)))
        return RESULTS + _WORKER.pack(worker_id) + serialization.dumps(safe)


def _unpicklable_result(exc: Exception, value) -> Exception:
    from multiprocessing.pool import MaybeEncodingError

    return MaybeEncodingError(exc, value)


def worker(address: str, cid: int, worker_id: int, initializer=None, initargs=()) -> None:
    if initializer is not None:
        initializer(*initargs)
    client = transport.Client(address)
    funcs: dict[int, object] = {}
    lines = collections.deque()
    hello = READY + _WORKER.pack(worker_id)
    for _ in range(2):
        ctx = client.context()
        ctx.send(cid, hello)
        lines.append(ctx)
    while lines:
        ctx = lines.popleft()
        reply = ctx.recv()
        if reply[:1] == STOP:
            ctx.close()
            continue
        batch = serialization.loads(memoryview(reply)[1:])
        results = run_batch(batch, funcs)
        ctx.send(cid, encode_results(worker_id, results))
        lines.append(ctx)
    client.close()
