"""The loop a Pool worker runs in its job.

It keeps two request lines (0 and 1) open on the pool's channel and waits on them in
strict alternation, so that while it runs one batch of tasks the next batch is already
on its way. Each request names its line and carries the results of the batch that line
brought; the master mirrors the alternation, so it always knows which batch is running
(the nng wire does not promise that two lines' requests arrive in the order they were
sent; the stream wire the pool uses does, and the mirror costs nothing). A ``STOP``
answer retires a line; the worker exits when both are retired (pool closed, shrunk, or
``maxtasksperchild`` reached). A batch of *suspect* tasks (ones that were running when a
worker died) comes flagged: the worker confirms on a third line that it starts it, so
that only a real start counts as an attempt.
"""

from __future__ import annotations

import collections
import logging
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from fiber.errors import ConnectionLostError
from fiber.wire import serialization, transport
from fiber.wire.protocol import POOL_HEADER as _HEADER
from fiber.wire.protocol import PoolOp, TaskKind

logger = logging.getLogger(__name__)

READY = PoolOp.READY
RESULTS = PoolOp.RESULTS
STARTED = PoolOp.STARTED
STOP = PoolOp.STOP
TASKS = PoolOp.TASKS
CALL, MAP, STARMAP = TaskKind.CALL, TaskKind.MAP, TaskKind.STARMAP


# [(task_id, func_id, func_bytes or None when the worker has it, kind, payload), ...]
Batch = Sequence[tuple[int, int, bytes | None, int, Any]]


def load_functions(batch: Batch, funcs: dict[int, Any]) -> None:
    """Unpickle the functions a batch brings (this may import their modules)."""
    for _, func_id, func_bytes, _, _ in batch:
        if func_bytes is not None and func_id not in funcs:
            funcs[func_id] = serialization.loads_code(func_bytes)


def run_batch(batch: Batch, funcs: dict[int, Any]) -> list[tuple[int, bool, Any]]:
    """Run ``[(task_id, func_id, func_bytes, kind, payload), ...]``; returns
    ``[(task_id, ok, value), ...]`` where a failure's value is a packed exception."""
    load_functions(batch, funcs)
    results = []
    for task_id, func_id, _, kind, payload in batch:
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


def encode_results(worker_id: int, line: int, results: list[tuple[int, bool, Any]]) -> bytes:
    head = RESULTS + _HEADER.pack(worker_id, line)
    try:
        return head + serialization.dumps(results)
    except pickle.PicklingError:
        safe = []
        for task_id, ok, value in results:
            try:
                serialization.dumps(value)
                safe.append((task_id, ok, value))
            except pickle.PicklingError as exc:
                error = _unpicklable_result(exc, value)
                safe.append((task_id, False, serialization.pack_exception(error)))
        return head + serialization.dumps(safe)


def _unpicklable_result(exc: Exception, value: Any) -> Exception:
    import multiprocessing.pool  # lazy: only for a result that cannot be pickled

    error: type[Exception] = multiprocessing.pool.MaybeEncodingError  # type: ignore[attr-defined]  # missing from typeshed
    return error(exc, value)


def worker(address: str, cid: int, worker_id: int,
           initializer: Callable[..., object] | None = None,
           initargs: Sequence[Any] = ()) -> None:
    if initializer is not None:
        serialization.rebind_main(initializer)(*initargs)
    client = transport.get_client(address)
    funcs: dict[int, object] = {}
    confirm = client.context()
    lines: collections.deque[tuple[int, Any]] = collections.deque()
    for line in (0, 1):
        ctx = client.context()
        ctx.send(cid, READY + _HEADER.pack(worker_id, line))
        lines.append((line, ctx))
    while lines:
        line, ctx = lines.popleft()
        try:
            reply = ctx.recv()
        except ConnectionLostError as exc:
            # the pool was terminated or collected (or its program ended): nothing is
            # left to do, as a multiprocessing worker exits when its queue is gone
            logger.debug("pool worker %d exits: %s", worker_id, exc)
            return
        if reply[:1] == STOP:
            ctx.close()
            continue
        suspect, batch = serialization.loads(memoryview(reply)[1:])
        if suspect:
            load_functions(batch, funcs)  # slow imports are not the task's fault
            confirm.request(cid, STARTED + _HEADER.pack(worker_id, line))
        results = run_batch(batch, funcs)
        ctx.send(cid, encode_results(worker_id, line, results))
        lines.append((line, ctx))
    confirm.close()
