"""The floor: what any Python library's round trip and rounds cost on this machine.

Measured in one process, interleaved with fiber's and multiprocessing's pools so that
the machine's load hits all of them alike:

* **round trip**: a small pickle sent over a Unix socket (``socket.socketpair``) to a
  forked echo process, which unpickles it, pickles the answer and sends it back; the
  parent unpickles it. Length-prefixed frames, one ``sendall`` and as few ``recv`` as
  the kernel allows each way. Against it: ``apply_async(noop, (i,)).get()`` of
  ``fiber.Pool(workers)`` and of ``multiprocessing.Pool(workers)`` (fork context).
* **rounds** (the RL pattern): ``workers`` tasks of ``time.sleep(d)`` sent, then the
  ``workers`` results received, repeated; over raw sockets each of ``workers`` forked
  processes has its own socket pair and one task per round (no scheduler at all);
  against it the same rounds of ``apply_async`` + ``get`` on each pool. Reported as
  actual time / ideal time (``count * d``).

The echo processes are forked before any pool exists (so they inherit no threads), the
fork pool before fiber's. Each block of calls or rounds is timed per contender in a
rotated order; medians over blocks are quoted.
"""

from __future__ import annotations

import os
import pickle
import socket
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

from bench import tasks

_HEADER = struct.Struct("!I")
CONTENDERS = ("floor", "fiber", "mp-fork")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the peer closed its socket")
        buf += chunk
    return bytes(buf)


def send_obj(sock: socket.socket, obj: Any) -> None:
    """One frame: a 4-byte length, then the pickle."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


def recv_obj(sock: socket.socket) -> Any:
    head = sock.recv(65536)
    if not head:
        raise EOFError("the peer closed its socket")
    if len(head) < 4:
        head += _recv_exact(sock, 4 - len(head))
    (size,) = _HEADER.unpack_from(head)
    body = head[4:]
    if len(body) < size:
        body += _recv_exact(sock, size - len(body))
    return pickle.loads(body)


def _serve(sock: socket.socket) -> None:
    """Child: run every ``(fn, arg)`` received and send its result; stop on None."""
    while True:
        try:
            msg = recv_obj(sock)
        except EOFError:
            return
        if msg is None:
            return
        fn, arg = msg
        send_obj(sock, fn(arg))


class RawWorkers:
    """``n`` forked processes, each behind its own Unix socket pair."""

    def __init__(self, n: int) -> None:
        self.socks: list[socket.socket] = []
        self.pids: list[int] = []
        for _ in range(n):
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            pid = os.fork()
            if pid == 0:  # the child: serve, then leave without running the parent's exit
                code = 0
                try:
                    parent.close()
                    for s in self.socks:
                        s.close()
                    _serve(child)
                except BaseException:  # noqa: BLE001 - a child must never return
                    code = 1
                finally:
                    os._exit(code)
            child.close()
            self.socks.append(parent)
            self.pids.append(pid)

    def call(self, fn: Callable, arg: Any) -> Any:
        sock = self.socks[0]
        send_obj(sock, (fn, arg))
        return recv_obj(sock)

    def round(self, fn: Callable, args: list) -> list:
        for sock, a in zip(self.socks, args, strict=True):
            send_obj(sock, (fn, a))
        return [recv_obj(sock) for sock in self.socks]

    def close(self) -> None:
        for sock in self.socks:
            try:
                send_obj(sock, None)
            except OSError:
                pass
            sock.close()
        for pid in self.pids:
            os.waitpid(pid, 0)


class _PoolAdapter:
    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def call(self, fn: Callable, arg: Any) -> Any:
        return self.pool.apply_async(fn, (arg,)).get()

    def round(self, fn: Callable, args: list) -> list:
        handles = [self.pool.apply_async(fn, (a,)) for a in args]
        return [h.get() for h in handles]

    def close(self) -> None:
        self.pool.close()
        self.pool.join()


def _rt_block(s: Any, calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        r = s.call(tasks.noop, i)
        out.append(time.perf_counter() - t0)
        if r != i:
            raise AssertionError(f"round trip returned {r!r}, not {i!r}")
    return out


def _rounds_block(s: Any, d: float, workers: int, count: int) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        got = s.round(tasks.sleep, [d] * workers)
        if len(got) != workers:
            raise AssertionError("a round lost results")
    return time.perf_counter() - t0


def measure(blocks: int, calls: int, rounds: int, workers: int = 5,
            d: float = 0.001) -> dict[str, float]:
    """Medians over ``blocks`` interleaved blocks: ``rt_us/C`` (median round trip of a
    block of ``calls``), ``rt_p90_us/C``, and ``rounds/C`` (a block of ``rounds`` rounds
    of ``workers`` sleeps of ``d``: actual / ideal) for C in :data:`CONTENDERS`."""
    import multiprocessing

    import fiber

    sessions: dict[str, Any] = {}
    try:
        sessions["floor"] = RawWorkers(workers)
        sessions["mp-fork"] = _PoolAdapter(multiprocessing.get_context("fork").Pool(workers))
        sessions["fiber"] = _PoolAdapter(fiber.Pool(workers))
        for s in sessions.values():  # untimed: every worker up, the tasks' module loaded
            s.round(tasks.sleep, [0.0] * workers)
            _rt_block(s, min(calls, 20))
        rt: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        p90: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        rr: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        ideal = rounds * d
        for b in range(blocks):
            k = b % len(CONTENDERS)
            for c in CONTENDERS[k:] + CONTENDERS[:k]:
                samples = sorted(_rt_block(sessions[c], calls))
                rt[c].append(statistics.median(samples) * 1e6)
                p90[c].append(samples[int(0.9 * (len(samples) - 1))] * 1e6)
                rr[c].append(_rounds_block(sessions[c], d, workers, rounds) / ideal)
        out: dict[str, float] = {}
        for c in CONTENDERS:
            out[f"rt_us/{c}"] = statistics.median(rt[c])
            out[f"rt_p90_us/{c}"] = statistics.median(p90[c])
            out[f"rounds/{c}"] = statistics.median(rr[c])
        return out
    finally:
        for s in sessions.values():
            s.close()


# Targets of issue #19, as multiples of the floor measured in the same run.
TARGETS = (("rt_us", 2.0, "round trip `apply_async(noop).get()` within 2x of the floor"),
           ("rounds", 1.15, "rounds of 5 x 1 ms within 1.15x of the floor's rounds"))


def judge(m: dict[str, float], name: str = "fiber") -> list[tuple[str, float | None, bool | None]]:
    """(target text, ratio of ``name`` to the floor, met?) for each target."""
    out: list[tuple[str, float | None, bool | None]] = []
    for metric, limit, text in TARGETS:
        v, floor = m.get(f"{metric}/{name}"), m.get(f"{metric}/floor")
        if v is None or not floor:
            out.append((text, None, None))
        else:
            out.append((text, v / floor, v / floor <= limit))
    return out


def section(data: dict) -> list[str]:
    """The RESULTS.md section: the floor, fiber and multiprocessing side by side, the
    targets judged (met, or by how much missed)."""
    from bench.report import _errors_for, _fmt, _table

    cfg = data["meta"]["config"]
    runs = [r for r in data["runs"] if r["kind"] == "floor"]
    names = sorted({r["contender"] for r in runs})
    per = data["summary"]["medians"].get("floor", {})  # fiber's run, not a baseline's
    m = per.get("fiber") or next(iter(per.values()), None)
    out = ["## 11. The floor", "",
           "The floor for any Python library on this machine, measured in the same process "
           "as the pools, interleaved (`bench/floor.py`): a small pickle sent over a Unix "
           "socket pair to a forked echo process and its answer back (length-prefixed "
           "frames, `pickle.dumps`/`loads` each way), and rounds of 5 tasks of "
           "`time.sleep(0.001)` sent to 5 forked processes over their own sockets, then "
           "the 5 results received. Against them: `apply_async(noop, (i,)).get()` and "
           "rounds of 5 `apply_async` + 5 `get` on `fiber.Pool(5)` and "
           "`multiprocessing.Pool(5)` (fork). Medians of "
           f"{cfg.get('floor_blocks', '?')} blocks of {cfg.get('floor_calls', '?')} calls "
           f"and of {cfg.get('floor_rounds', '?')} rounds; rounds as actual / ideal time; "
           "ratios to the floor.", ""]
    if not m:
        out.append("Not measured in this run.")
        out += _errors_for(data, ["floor"], names)
        return out
    rows = []
    for c, label in (("floor", "raw Unix socket (the floor)"), ("fiber", "fiber.Pool"),
                     ("mp-fork", "multiprocessing.Pool (fork)")):
        rt, rr = m.get(f"rt_us/{c}"), m.get(f"rounds/{c}")
        rows.append([label, _fmt(rt) + _x(rt, m.get("rt_us/floor")),
                     _fmt(m.get(f"rt_p90_us/{c}")),
                     _fmt(rr) + _x(rr, m.get("rounds/floor"))])
    out += _table(["", "round trip, median us (x floor)", "p90 us",
                   "rounds 5 x 1 ms, x ideal (x floor)"], rows)
    out += ["", "Targets (issue #19), fiber against the floor of this run; multiprocessing "
            "held to the same limits:", ""]
    jrows = []
    for (text, ratio, met), (_, mp_ratio, mp_met) in zip(judge(m), judge(m, "mp-fork"),
                                                         strict=True):
        limit = next(lim for _, lim, t in TARGETS if t == text)
        jrows.append([text, "-" if ratio is None else f"{ratio:.2f}x",
                      _verdict(ratio, met, limit),
                      "-" if mp_ratio is None else f"{mp_ratio:.2f}x ({_verdict(mp_ratio, mp_met, limit)})"])
    out += _table(["target", "fiber / floor", "met?", "mp-fork / floor"], jrows)
    out += _errors_for(data, ["floor"], names)
    return out


def _x(v: float | None, base: float | None) -> str:
    return "" if v is None or not base else f" ({v / base:.2f}x)"


def _verdict(ratio: float | None, met: bool | None, limit: float) -> str:
    if met is None or ratio is None:
        return "-"
    return "met" if met else f"**missed by {ratio / limit:.2f}x**"
