"""Ring: a group of equal peers (job-backed processes) that find each other, e.g. for
``torch.distributed``.

``Ring(processes, func, initializer=None, initargs=()).run()`` starts ``processes``
members as :class:`fiber.Process` jobs. Rendezvous goes through the parent: every
member reports its host (the address its backend says other jobs can reach) over a
fiber Queue, rank 0 also a free port there; the parent then sends every member rank
0's address and its rank among the members on the same host. Each member sets
``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
``LOCAL_WORLD_SIZE`` in its environment (and, unless set, ``GLOO_SOCKET_IFNAME`` to the
interface of the member's reachable address, e.g. ``lo`` on the local backend), so
``torch.distributed.init_process_group("gloo")`` needs no more arguments; then it
calls ``initializer(*initargs)`` and ``func(rank, world_size)`` (an initializer of
uber/fiber's form, ``init(ring)``, is given a view of the ring: :mod:`fiber.uber_ring`). :func:`context`
returns the same facts as a :class:`RingContext` inside a member.

Each member's job asks for the resources of ``func``'s ``@fiber.meta`` (as uber/fiber's
Ring did: its example asks a GPU per member with ``@fiber.meta(gpu=1)``).

``run()`` returns the members' results in rank order. If a member raises, or its job
ends without a result, the other members are terminated and ``run()`` raises
:class:`RingError` naming the member.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fiber.errors import ProcessError, documented

if TYPE_CHECKING:  # imported when a ring runs (start-up time)
    from fiber.process import Process
    from fiber.queues import Queue

__all__ = ["Ring", "RingContext", "RingError", "context"]

logger = logging.getLogger("fiber.ring")

RENDEZVOUS_TIMEOUT = 600.0  # jobs may queue on a cluster before they start
POLL = 0.5


@documented
class RingError(ProcessError):
    """A ring member failed (``rank`` says which); the others were stopped."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


@dataclass(frozen=True)
class RingContext:
    """What a ring member knows about the ring."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


_context: list[RingContext | None] = [None]


def context() -> RingContext:
    """The ring facts of the calling member (raises outside a ring member)."""
    if _context[0] is None:
        raise RuntimeError("fiber.ring.context() is only available in a ring member")
    return _context[0]


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _interface_of(host: str) -> str | None:
    """The name of the network interface whose (primary IPv4) address is ``host``."""
    import fcntl
    import struct

    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                info = fcntl.ioctl(sock.fileno(), SIOCGIFADDR,
                                   struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if info[20:24] == packed:
                return name
    if host == "127.0.0.1":
        return "lo"
    return None


SIOCGIFADDR = 0x8915

#: what a member reports first: its reachable address, its host name, and (rank 0) a
#: free port for the ring's master
Hello = tuple[str, str, int | None]


def _member(rank: int, world_size: int, reports: Queue, inbox: Queue,
            func: Callable[[int, int], Any], initializer: Callable[..., object] | None,
            initargs: tuple[Any, ...]) -> None:
    """The body of one ring member's job."""
    from fiber.runtime.run import listen_host  # in the member's job only

    host = listen_host()
    port = _free_port(host) if rank == 0 else None
    reports.put(("hello", rank, (host, socket.gethostname(), port)))
    master_addr, master_port, local_rank, local_size = inbox.get()
    ctx = RingContext(rank, world_size, local_rank, local_size, master_addr, master_port)
    _context[0] = ctx
    os.environ.update({
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
    })
    interface = _interface_of(host)
    if interface is not None:  # gloo then uses the address the ring can reach
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    try:
        if initializer is not None:
            from fiber import uber_ring  # (uber/fiber's initializer(ring) too)

            uber_ring.call_initializer(initializer, initargs, rank, world_size,
                                       (master_addr, master_port))
        result = func(rank, world_size)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        import traceback

        reports.put(("error", rank, (repr(exc), traceback.format_exc())))
        return
    reports.put(("result", rank, result))


class Ring:
    """``processes`` equal members running ``func(rank, world_size)``."""

    def __init__(self, processes: int, func: Callable[[int, int], Any],
                 initializer: Callable[..., object] | None = None,
                 initargs: Iterable[Any] | None = (), *, ctx: Any = None) -> None:
        if not isinstance(processes, int) or isinstance(processes, bool) or processes < 1:
            raise ValueError(f"processes must be a positive int, not {processes!r}")
        if not callable(func):
            raise TypeError(f"func must be callable, not {func!r}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be callable, not {initializer!r}")
        self.processes = processes
        self.func = func
        self.initializer = initializer
        self.initargs = tuple(initargs) if initargs is not None else ()  # uber/fiber's None
        self.members: list[Process] = []
        # the context its members and rendezvous queues are of (``ctx.Ring``; None:
        # the default context's)
        self._ctx = ctx

    def run(self, timeout: float | None = None) -> list[Any]:
        """Start the members, wait for all, return their results in rank order.
        ``timeout`` (seconds) bounds the whole run (default: none)."""
        # imported when a ring runs (start-up time, as above)
        from fiber.process import Process
        from fiber.queues import Queue
        from fiber.runtime import run

        if self.members:
            raise RuntimeError("a Ring runs once; make a new Ring to run again")
        ctx: Any = self._ctx if run.carries(self._ctx) else None
        process_class = ctx.Process if ctx is not None else Process
        reports = Queue(ctx=ctx)
        inboxes = [Queue(ctx=ctx) for _ in range(self.processes)]
        # the members run _member, not func: func's @fiber.meta requests are theirs
        requests = getattr(self.func, "__fiber_meta__", None) or None
        self.members = [
            process_class(target=_member, name=f"ring-{rank}",
                    args=(rank, self.processes, reports, inboxes[rank], self.func,
                          self.initializer, self.initargs), resources=requests)
            for rank in range(self.processes)]
        started: list[Process] = []
        try:
            for member in self.members:
                member.start()  # (may raise: e.g. resources the backend cannot honour)
                started.append(member)
            return self._collect(reports, inboxes, timeout)
        finally:
            self._stop(started)

    def _collect(self, reports: Queue, inboxes: list[Queue],
                 timeout: float | None) -> list[Any]:
        n = self.processes
        hellos: dict[int, Hello] = {}
        results: dict[int, Any] = {}
        start = time.monotonic()
        while len(results) < n:
            try:
                report = reports.get(timeout=POLL)
            except queue.Empty:
                # a member's last report is queued before its job ends: see which
                # members have ended, then read what is queued, then judge them
                ended = [(rank, m.exitcode) for rank, m in enumerate(self.members)
                         if not m.is_alive() and m.exitcode is not None]
                pending = []
                while True:
                    try:
                        pending.append(reports.get_nowait())
                    except queue.Empty:
                        break
                for report in pending:
                    self._handle(report, hellos, results, inboxes)
                self._check_members(ended, results, hellos, start, timeout)
                continue
            self._handle(report, hellos, results, inboxes)
        return [results[rank] for rank in range(n)]

    def _handle(self, report: tuple[str, int, Any], hellos: dict[int, Hello],
                results: dict[int, Any], inboxes: list[Queue]) -> None:
        kind, rank, body = report
        n = self.processes
        if kind == "hello":
            hellos[rank] = body
            if len(hellos) == n:
                self._broadcast(hellos, inboxes)
        elif kind == "result":
            results[rank] = body
        else:
            what, text = body
            raise RingError(f"ring member {rank} failed: {what}\n\nRemote traceback:\n"
                            f"{text}", rank)

    def _broadcast(self, hellos: dict[int, Hello], inboxes: list[Queue]) -> None:
        master_host, _, master_port = hellos[0]
        by_host: dict[tuple[str, str], list[int]] = {}
        for rank in sorted(hellos):
            host, hostname, _ = hellos[rank]
            by_host.setdefault((host, hostname), []).append(rank)
        for ranks in by_host.values():
            for local_rank, rank in enumerate(ranks):
                inboxes[rank].put((master_host, master_port, local_rank, len(ranks)))
        logger.debug("ring of %d members: master %s:%s", len(hellos), master_host, master_port)

    def _check_members(self, ended: list[tuple[int, int]], results: dict[int, Any],
                       hellos: dict[int, Hello], start: float,
                       timeout: float | None) -> None:
        for rank, code in ended:
            if rank in results:
                continue
            member = self.members[rank]
            raise RingError(
                f"ring member {rank} ({member.name}, job {member.job_id}) ended with exit "
                f"code {code} before it returned a result", rank)
        elapsed = time.monotonic() - start
        if len(hellos) < self.processes and elapsed > RENDEZVOUS_TIMEOUT:
            missing = sorted(set(range(self.processes)) - set(hellos))
            raise RingError(f"ring members {missing} did not start within "
                            f"{RENDEZVOUS_TIMEOUT:.0f}s", missing[0])
        if timeout is not None and elapsed > timeout:
            raise RingError(f"the ring did not finish within {timeout}s")

    def _stop(self, started: list[Process]) -> None:
        """Terminate the ``started`` members still running (after a failure) and join
        them all."""
        for member in started:
            if member.is_alive():
                member.terminate()
        for member in started:
            try:
                member.join(30)
                if member.is_alive():
                    member.kill()
                    member.join(30)
            except ProcessError:
                logger.debug("joining %s failed", member.name, exc_info=True)
