"""Shared state: locks, values, arrays and events used by a child process.

Three ways are measured side by side in one run, interleaved (the order rotated every
repetition):

* ``multiprocessing``: its fork context's ``Lock``, ``Value``, ``Array``, ``Event``,
  used by a child ``multiprocessing.Process``;
* ``fiber``: ``fiber.Lock()``... used by a child ``fiber.Process`` of the same host
  (shared memory and shared-memory semaphores);
* ``fiber-creator``: the same objects used by a child whose ``shared_memory`` setting
  is off (``FIBER_SHARED_MEMORY=false``), as a child on another host uses them:
  through their creator, one round trip per operation. Its reference is the pool's
  round trip, ``fiber.Pool(1).apply_async(f).get()``, measured in the same run.

The child times each operation over a time budget and reports microseconds per
operation. The "program" row is the issue's program: 4 children wait for an event,
then each does 1,000 locked increments of one ``Value``; the time from setting the
event until all four are done (the final value is checked: 4,000).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

PATHS = ("multiprocessing", "fiber", "fiber-creator")
OPS = ("lock", "value_read", "value_incr", "array_slice", "event")
PROGRAM_PROCESSES = 4
PROGRAM_INCREMENTS = 1000


def _time_op(fn: Any, budget: float) -> float:
    """Microseconds per call of ``fn``, called in batches until ``budget`` seconds."""
    for _ in range(20):  # warm-up (connections, caches)
        fn()
    calls, batch = 0, 10
    start = time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        calls += batch
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            return elapsed / calls * 1e6
        batch = min(batch * 2, 5000)


def _ops(lock: Any, value: Any, array: Any, event: Any) -> dict[str, Any]:
    def lock_op() -> None:
        lock.acquire()
        lock.release()

    def value_read() -> None:
        value.value  # noqa: B018 - the read is what is measured

    def value_incr() -> None:
        with value.get_lock():
            value.value += 1

    def array_slice() -> None:
        array[:]  # noqa: B018

    def event_op() -> None:
        event.set()
        event.is_set()

    return {"lock": lock_op, "value_read": value_read, "value_incr": value_incr,
            "array_slice": array_slice, "event": event_op}


def _child(objs: tuple, budget: float, out: Any) -> None:
    try:
        ops = _ops(*objs)
        out.put({name: _time_op(ops[name], budget) for name in OPS})
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _incrementer(go: Any, value: Any, done: Any) -> None:
    go.wait()
    for _ in range(PROGRAM_INCREMENTS):
        with value.get_lock():
            value.value += 1
    done.put(1)


class _Side:
    """How one path makes objects and processes."""

    def __init__(self, path: str) -> None:
        self.path = path
        if path == "multiprocessing":
            import multiprocessing

            self.mod: Any = multiprocessing.get_context("fork")
        else:
            import fiber

            self.mod = fiber

    def __enter__(self) -> _Side:
        if self.path == "fiber-creator":
            import fiber

            fiber.init(shared_memory=False)  # the children use the objects remotely
        return self

    def __exit__(self, *exc: object) -> None:
        if self.path == "fiber-creator":
            import fiber

            fiber.init(shared_memory=True)

    def objects(self) -> tuple:
        m = self.mod
        return (m.Lock(), m.Value("d", 0.0), m.Array("d", 1000), m.Event())

    def single(self, budget: float) -> dict[str, float]:
        out = self.mod.Queue()
        p = self.mod.Process(target=_child, args=(self.objects(), budget, out))
        p.start()
        result = out.get(timeout=600)
        p.join(60)
        if "error" in result:
            raise RuntimeError(f"{self.path}: {result['error']}")
        return result

    def program(self) -> float:
        m = self.mod
        go, value, done = m.Event(), m.Value("i", 0), m.Queue()
        procs = [m.Process(target=_incrementer, args=(go, value, done))
                 for _ in range(PROGRAM_PROCESSES)]
        for p in procs:
            p.start()
        time.sleep(0.2)  # let them reach go.wait() (started is not yet waiting)
        t0 = time.perf_counter()
        go.set()
        for _ in procs:
            done.get(timeout=600)
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(60)
        if value.value != PROGRAM_PROCESSES * PROGRAM_INCREMENTS:
            raise RuntimeError(f"{self.path}: {value.value} increments counted, not "
                               f"{PROGRAM_PROCESSES * PROGRAM_INCREMENTS}")
        return elapsed * 1000.0


def _pool_roundtrip(budget: float) -> float:
    import fiber

    with fiber.Pool(1) as pool:
        return _time_op(lambda: pool.apply_async(int).get(), budget)


def measure(reps: int, budget: float) -> dict[str, float]:
    """Medians over ``reps`` interleaved repetitions: ``us/<op>/<path>`` (microseconds
    per operation in a child), ``ms/program/<path>`` and ``us/pool_roundtrip/fiber``."""
    values: dict[str, list[float]] = {}
    for rep in range(reps):
        k = rep % len(PATHS)
        for path in PATHS[k:] + PATHS[:k]:
            with _Side(path) as side:
                for op, us in side.single(budget).items():
                    values.setdefault(f"us/{op}/{path}", []).append(us)
                values.setdefault(f"ms/program/{path}", []).append(side.program())
        values.setdefault("us/pool_roundtrip/fiber", []).append(_pool_roundtrip(budget))
    return {key: statistics.median(v) for key, v in values.items()}
