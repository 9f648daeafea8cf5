"""Simulated pool workers speaking fiber's real wire protocol, many per process.

Run by the ``sim`` bench backend (bench/sim_plugin/fiber_sim.py) as ``python -m
bench.simulator``: it reads JSON lines on stdin (``start`` a job with its environment,
``end`` one, ``stats``) and writes events on stdout (``exit`` of a job, the counters).
One selector loop (one thread) drives every connection of the process, non-blocking.

Each job does what ``fiber.runtime.bootstrap`` and ``fiber.runtime.pool.worker`` do, on
the same bytes (fiber's own framing, HMAC primitives, pickles and result encoding are
imported, not rewritten): its connection to the parent's stream listener proves the
run's secret (``AUTH1``/``AUTH3``), says ``HELLO`` on its control channel, unpickles the
Process it is sent to learn its worker id(s), keeps a parked ``WATCH`` heartbeat and
answers ``END_KILL``/``END_TERM``; each worker opens a connection of its own (or, with
``BENCH_SIM_CONNS=1``, uses its job's), keeps lines 0 and 1 ``READY`` in strict
alternation, confirms suspect batches (``STARTED``), opens its give line on the job's
connection when a batch says ``OPEN_GIVE`` and gives back tasks not started on
``RECALL``, and sends ``RESULTS`` when a batch ends.

What is simulated: running a task. A task (an item, or a chunk of ``n`` items) costs
``BENCH_SIM_TASK_MS`` (x ``n``) of *simulated* time, no sleep and no CPU: a batch's
tasks end at fixed times from its start, and the loop wakes at the next end. The
function is never unpickled; a task's value is its input (``map``: the item;
``apply``: the first argument), so a map of ``range(n)`` comes back as ``range(n)``.
At each wake a busy worker sends one ``PARTIAL`` with the results that ended since its
previous message (the real ``ResultSender`` sends one per 1 ms task when it keeps up,
and what accumulated while it was writing when it does not); the counters say how many
results a message carried.
"""

from __future__ import annotations

import collections
import errno
import heapq
import json
import os
import pickle
import resource
import selectors
import socket
import sys
import threading
import time
from typing import Any

from fiber.runtime.pool.worker import encode_results
from fiber.wire import auth, protocol, serialization
from fiber.wire.framing import request_frame
from fiber.wire.protocol import (
    AUTH1,
    AUTH3,
    CLIENT_ROLE,
    HUB_ROLE,
    NONCE_SIZE,
    OK,
    POOL_HEADER,
    BatchFlag,
    Control,
    PoolOp,
    TaskKind,
)
from fiber.wire.stream.framing import FRAME, READ_SIZE, frame, split_address

TASK_SECONDS = float(os.environ.get("BENCH_SIM_TASK_MS", "1.0")) / 1000.0
CONNS = int(os.environ.get("BENCH_SIM_CONNS", "2"))
_now = time.monotonic
#: handshakes a simulator process has under way at once
HANDSHAKES = int(os.environ.get("BENCH_SIM_HANDSHAKES", "24"))

COUNTS: collections.Counter[str] = collections.Counter()
_events_lock = threading.Lock()


def emit(event: dict[str, Any]) -> None:
    with _events_lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


class Conn:
    """One non-blocking connection to the parent's stream listener: frames out, frames
    in (each to the handler of its line), the handshake first."""

    def __init__(self, loop: Loop, address: str, key: bytes, on_ready: Any, on_lost: Any) -> None:
        self.address = address
        self.loop = loop
        self.key = key
        self.rbuf = bytearray()
        self.wbuf = bytearray()
        self.handlers: dict[int, Any] = {0: self._auth_reply}
        self.on_ready = on_ready
        self.on_lost = on_lost
        self.closed = False
        self.writing = False
        self.sock: socket.socket | None = None
        self._nonce = auth.new_nonce()
        self._step = 1
        loop.admit(self)

    def start(self) -> None:
        """Connect and send the challenge (when the loop admits another handshake)."""
        host, port, local = split_address(self.address)
        if local:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: Any = "\0" + local
        else:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            target = (host, port)
        self.sock.setblocking(False)
        self._target = target
        self.connect()

    def connect(self) -> None:
        """Non-blocking: a full accept backlog (EAGAIN on a Unix socket) is tried
        again later, never waited for (the loop keeps every other connection going)."""
        assert self.sock is not None
        if self.closed:
            return
        try:
            self.sock.connect(self._target)
        except (BlockingIOError, InterruptedError) as exc:
            if isinstance(exc, BlockingIOError) and exc.errno == errno.EINPROGRESS:
                pass  # TCP: completes in the background, writes wait for it
            else:
                COUNTS["connect_retries"] += 1
                self.loop.retry(self)
                return
        except OSError:
            self.lose()
            return
        self.loop.sel.register(self.sock, selectors.EVENT_READ, self)
        self.send(0, AUTH1 + self._nonce)

    def _auth_reply(self, body: bytes) -> None:
        if self._step == 1:
            if body[:1] != OK or not auth.verify(self.key, HUB_ROLE, self._nonce,
                                                 body[1 + NONCE_SIZE:]):
                raise RuntimeError("the master does not hold this run's secret")
            self._step = 2
            self.send(0, AUTH3 + auth.answer(self.key, CLIENT_ROLE, body[1:1 + NONCE_SIZE]))
        else:
            if body[:1] != OK:
                raise RuntimeError("the master refused this run's secret")
            del self.handlers[0]
            self._step = 3
            self.loop.handshake_over()
            self.on_ready()

    def send(self, line: int, body: bytes) -> None:
        if self.closed:
            return
        self.wbuf += FRAME.pack(len(body), line) + body if len(body) < 65536 else frame(line, body)
        if not self.writing:
            self.flush()

    def flush(self) -> None:
        try:
            n = self.sock.send(self.wbuf)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self.lose()
            return
        del self.wbuf[:n]
        want = bool(self.wbuf)
        if want != self.writing:
            self.writing = want
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            self.loop.sel.modify(self.sock, events, self)

    def readable(self) -> None:
        chunk = self.loop.chunk
        buf = self.rbuf
        while True:
            try:
                n = self.sock.recv_into(chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                n = 0
            if not n:
                self.lose()
                return
            buf += memoryview(chunk)[:n]
            if n < len(chunk):
                break
        while len(buf) >= FRAME.size:
            size, line = FRAME.unpack_from(buf)
            end = FRAME.size + size
            if len(buf) < end:
                break
            body = bytes(buf[FRAME.size:end])
            del buf[:end]
            handler = self.handlers.get(line)
            if handler is not None:
                handler(body)
            if self.closed:
                return

    def lose(self) -> None:
        if self.closed:
            return
        self.close()
        self.on_lost()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.sock is None:
            return  # never started: the loop skips it
        if self._step < 3:
            self.loop.handshake_over()
        try:
            self.loop.sel.unregister(self.sock)
        except (KeyError, ValueError):
            pass
        self.sock.close()


class Batch:
    __slots__ = ("line", "number", "tasks", "i", "next_start", "done", "busy", "ran")

    def __init__(self, line: int, number: int, tasks: list[tuple[int, float, Any]]) -> None:
        self.line = line
        self.number = number
        self.tasks = tasks  # (task id, simulated seconds, value)
        self.i = 0  # the next task to end
        self.next_start = 0.0
        self.done: list[tuple[int, bool, Any]] = []  # ended, not sent yet
        self.busy = 0.0  # simulated seconds its tasks ran (the RESULTS message says)
        self.ran = 0  # tasks it ran (not given back)


def _value(kind: int, payload: Any) -> Any:
    if kind == TaskKind.CALL:
        args, _ = payload
        return args[0] if args else None
    if kind == TaskKind.MAP:
        return list(payload)
    return [x[0] if x else None for x in payload]


class Worker:
    """One pool worker: its two task lines, its batches, its give line."""

    def __init__(self, job: Job, wid: int) -> None:
        self.job = job
        self.wid = wid
        self.cid = job.pool_cid
        self.order: collections.deque[int] = collections.deque((0, 1))  # lines in turn
        self.received: dict[int, Batch] = {}
        self.numbers = [0, 0]  # batches received per line
        self.ended = [0, 0]  # batches ended per line
        self.skip: tuple[set[int], set[int]] = (set(), set())
        self.running: Batch | None = None
        self.give_open = False
        self.done = False
        self.conn: Conn | None = None
        # wire lines: pool lines 0 and 1, then PARTIAL's (one-way), then STARTED's
        if CONNS == 2:
            self.wire = {k: 1 + k for k in range(4)}
            self.conn = Conn(job.loop, job.pool_address, job.key, self._up, self._lost)
        else:
            base = job.next_lines(4)
            self.wire = {k: base + k for k in range(4)}
            self.conn = job.conn
            self._up()

    def _up(self) -> None:
        conn = self.conn
        assert conn is not None
        for pool_line in (0, 1):
            conn.handlers[self.wire[pool_line]] = lambda body, pl=pool_line: self._reply(pl, body)
            conn.send(self.wire[pool_line], request_frame(
                self.cid, PoolOp.READY + POOL_HEADER.pack(self.wid, pool_line)))
            COUNTS["ready"] += 1
        conn.handlers[self.wire[3]] = lambda body: None  # STARTED's answer

    def _lost(self) -> None:
        self.finish()

    def _reply(self, pool_line: int, body: bytes) -> None:
        if body[:1] != OK:
            raise RuntimeError(f"worker {self.wid}: the master answered an error: {body[1:200]!r}")
        if body[1:2] == PoolOp.STOP:
            if pool_line in self.order:
                self.order.remove(pool_line)
            if not self.order and self.running is None:
                self.finish()
            else:
                self._next(_now())
            return
        COUNTS["batches"] += 1
        message = serialization.loads(memoryview(body)[2:])  # (flags, batch[, forget])
        flags, batch = message[0], message[1]
        flags = int(flags)
        self.numbers[pool_line] += 1
        tasks = []
        for task_id, _fid, _fbytes, kind, payload in batch:
            items = len(payload) if kind != TaskKind.CALL else 1
            tasks.append((task_id, TASK_SECONDS * items, _value(kind, payload)))
        COUNTS["tasks_received"] += len(tasks)
        self.received[pool_line] = Batch(pool_line, self.numbers[pool_line], tasks)
        if flags & BatchFlag.OPEN_GIVE and not self.give_open:
            self.job.open_give(self)
        if flags & BatchFlag.SUSPECT:
            assert self.conn is not None
            self.conn.send(self.wire[3], request_frame(
                self.cid, PoolOp.STARTED + POOL_HEADER.pack(self.wid, pool_line)))
        if self.running is None:
            self._next(_now())

    def _next(self, now: float) -> None:
        """Start the batch of the line whose turn it is, if it came."""
        if self.running is not None or not self.order:
            return
        line = self.order[0]
        batch = self.received.pop(line, None)
        if batch is None:
            return
        self.order.rotate(-1)
        batch.next_start = now
        self.running = batch
        self.advance(now)

    def started(self, batch: Batch, now: float) -> set[int]:
        ids = {t[0] for t in batch.tasks[:batch.i]}
        if batch.i < len(batch.tasks) and batch.next_start <= now:
            ids.add(batch.tasks[batch.i][0])
        return ids

    def grant(self, line: int, number: int, ids: list[int]) -> list[int]:
        if line not in (0, 1) or self.ended[line] >= number:
            return []
        run = self.running
        started = self.started(run, _now()) if run is not None and run.line == line else set()
        given = [tid for tid in ids if tid not in started]
        self.skip[line].update(given)
        return given

    def advance(self, now: float) -> None:
        """End the tasks of the running batch due by ``now``; send their results."""
        batch = self.running
        if batch is None:
            return
        tasks, skip = batch.tasks, self.skip[batch.line]
        while batch.i < len(tasks):
            task_id, cost, value = tasks[batch.i]
            if task_id in skip:
                batch.i += 1
                continue
            end = batch.next_start + cost
            if end > now:
                break
            batch.done.append((task_id, True, value))
            batch.busy += cost
            batch.ran += 1
            batch.next_start = end
            batch.i += 1
        conn = self.conn
        assert conn is not None
        if batch.i >= len(tasks):
            COUNTS["results"] += len(batch.done)
            COUNTS["results_msgs"] += 1
            self.ended[batch.line] += 1
            skip.clear()
            conn.send(self.wire[batch.line], request_frame(
                self.cid, encode_results(self.wid, batch.line, batch.done,
                                         busy=batch.busy, ran=batch.ran)))
            self.running = None
            if not self.order and not self.received:
                self.finish()
                return
            self._next(batch.next_start)  # (simulated time goes on from the last end)
            return
        if batch.done:
            COUNTS["results"] += len(batch.done)
            COUNTS["partial_msgs"] += 1
            conn.send(self.wire[2], request_frame(
                self.cid, encode_results(self.wid, batch.line, batch.done, PoolOp.PARTIAL)))
            batch.done = []
        self.job.loop.at(batch.next_start + tasks[batch.i][1], self)

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        if CONNS == 2 and self.conn is not None:
            self.conn.close()
        self.job.worker_done()


class Job:
    """One simulated job: its connection, hello, heartbeat, workers and give lines."""

    def __init__(self, loop: Loop, job_id: str, env: dict[str, str]) -> None:
        self.loop = loop
        self.id = job_id
        self.key = bytes.fromhex(env[auth.AUTHKEY_ENV])
        self.address = env["_FIBER_PARENT"]
        self.channel = int(env["_FIBER_CHANNEL"])
        self.pool_address = self.address
        self.pool_cid = 0
        self.workers: list[Worker] = []
        self.left = 0
        self.ended = False
        self._lines = 10
        self.give_lines: dict[int, int] = {}
        self.conn = Conn(loop, self.address, self.key, self._hello, self._lost)

    def next_lines(self, count: int) -> int:
        first = self._lines
        self._lines += count
        return first

    def _hello(self) -> None:
        self.conn.handlers[1] = self._bundle
        self.conn.send(1, request_frame(self.channel, Control.HELLO + protocol.hello(
            os.getpid(), socket.gethostname())))

    def _bundle(self, body: bytes) -> None:
        if body[:1] != OK:
            raise RuntimeError(f"job {self.id} refused: {body[1:300]!r}")
        _prep, payload = pickle.loads(body[1:])
        process = serialization.loads_code(payload)
        address, cid, ids = process._args[:3]
        ids = [ids] if isinstance(ids, int) else list(ids)
        self.pool_address, self.pool_cid = address, cid
        self.conn.handlers[2] = self._beat
        self._watch()
        self.left = len(ids)
        self.workers = [Worker(self, wid) for wid in ids]

    def _watch(self) -> None:
        COUNTS["watch"] += 1
        self.conn.send(2, request_frame(self.channel, Control.WATCH))

    def _beat(self, body: bytes) -> None:
        answer = body[1:]
        if answer == Control.END_KILL:
            self.end(-9)
        elif answer == Control.END_TERM:
            self.end(-15)
        else:
            self._watch()

    def open_give(self, worker: Worker) -> None:
        line = self.give_lines.get(worker.wid)
        if line is None:
            line = self.give_lines[worker.wid] = self.next_lines(1)
            self.conn.handlers[line] = lambda body, w=worker: self._give_reply(w, body)
        worker.give_open = True
        COUNTS["give_opened"] += 1
        self.conn.send(line, request_frame(worker.cid, PoolOp.GIVE + POOL_HEADER.pack(
            worker.wid, 0) + serialization.dumps([])))

    def _give_reply(self, worker: Worker, body: bytes) -> None:
        payload = body[1:]
        if payload[:1] != PoolOp.RECALL:
            worker.give_open = False  # STOP
            return
        COUNTS["recalls"] += 1
        line, number, ids = serialization.loads(memoryview(payload)[1:])
        given = worker.grant(line, number, ids)
        COUNTS["given_back"] += len(given)
        self.conn.send(self.give_lines[worker.wid], request_frame(
            worker.cid, PoolOp.GIVE + POOL_HEADER.pack(worker.wid, line)
            + serialization.dumps(given)))
        if worker.running is not None:
            worker.advance(_now())  # a skipped task may end the batch now

    def worker_done(self) -> None:
        self.left -= 1
        if self.left <= 0 and not self.ended:
            self.conn.handlers[1] = lambda body: self.end(0)
            self.conn.send(1, request_frame(self.channel, Control.EXIT + pickle.dumps(0)))

    def _lost(self) -> None:
        self.end(70)  # bootstrap's PARENT_GONE_EXIT

    def end(self, code: int) -> None:
        if self.ended:
            return
        self.ended = True
        for w in self.workers:
            w.done = True
            if CONNS == 2 and w.conn is not None:
                w.conn.close()
        self.conn.close()
        self.loop.jobs.pop(self.id, None)
        emit({"op": "exit", "id": self.id, "code": code})


class Loop:
    """The selector loop: connections' events, the next task ends, stdin's commands."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.chunk = bytearray(READ_SIZE)
        self.timers: list[tuple[float, int, Worker]] = []
        self._seq = 0
        self.jobs: dict[str, Job] = {}
        self.commands: collections.deque[dict[str, Any]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.quit = False
        self.started = time.perf_counter()
        self.handshaking = 0
        self.retries: collections.deque[tuple[float, Conn]] = collections.deque()
        self.waiting: collections.deque[Conn] = collections.deque()

    def admit(self, conn: Conn) -> None:
        """Start ``conn`` now, or when fewer than :data:`HANDSHAKES` are under way
        (the master's gate keeps at most 256 pending, the oldest closed for a new one;
        real jobs arrive spread by their start-up)."""
        if self.handshaking < HANDSHAKES:
            self.handshaking += 1
            conn.start()
        else:
            self.waiting.append(conn)

    def handshake_over(self) -> None:
        self.handshaking -= 1
        while self.waiting and self.handshaking < HANDSHAKES:
            conn = self.waiting.popleft()
            if not conn.closed:
                self.handshaking += 1
                conn.start()

    def retry(self, conn: Conn) -> None:
        """Connect ``conn`` again in 20 ms (the listener's backlog was full)."""
        self.retries.append((_now() + 0.02, conn))

    def at(self, when: float, worker: Worker) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (when, self._seq, worker))

    def command(self, message: dict[str, Any] | None) -> None:
        """From the stdin thread."""
        if message is None:
            self.quit = True
        else:
            self.commands.append(message)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _run_commands(self) -> None:
        while self.commands:
            m = self.commands.popleft()
            if m["op"] == "start":
                self.jobs[m["id"]] = Job(self, m["id"], m["env"])
            elif m["op"] == "end":
                job = self.jobs.get(m["id"])
                if job is not None:
                    job.end(int(m["code"]))
            elif m["op"] == "stats":
                ru = resource.getrusage(resource.RUSAGE_SELF)
                emit({"op": "stats", "pid": os.getpid(), "cpu_s": ru.ru_utime + ru.ru_stime,
                      "wall_s": time.perf_counter() - self.started,
                      "jobs": len(self.jobs), "max_rss_kb": ru.ru_maxrss, **COUNTS})

    def run(self) -> None:
        timers = self.timers
        while not self.quit:
            timeout = None
            if timers:
                timeout = max(0.0, timers[0][0] - _now())
            if self.retries:
                timeout = max(0.0, min(timeout or 1.0, self.retries[0][0] - _now()))
            for key, _ in self.sel.select(timeout):
                conn = key.data
                if conn is None:
                    try:
                        self._wake_r.recv(4096)
                    except BlockingIOError:
                        pass
                    self._run_commands()
                    continue
                if conn.closed:
                    continue
                if conn.writing:
                    conn.flush()
                conn.readable()
            now = _now()
            while self.retries and self.retries[0][0] <= now:
                self.retries.popleft()[1].connect()
            while timers and timers[0][0] <= now:
                _, _, worker = heapq.heappop(timers)
                if not worker.done and worker.running is not None:
                    worker.advance(now)
        for job in list(self.jobs.values()):
            job.end(-9)


def _stdin(loop: Loop) -> None:
    for text in sys.stdin:
        loop.command(json.loads(text))
    loop.command(None)  # the backend's process is gone: so are its jobs


def main() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    loop = Loop()
    threading.Thread(target=_stdin, args=(loop,), daemon=True).start()
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
