"""Slot accounting and placement for the ssh backend.

A job takes ``max(1, ceil(cpu))`` slots of a host (one when it asks for no cpu) and,
when it asks for memory, that many MiB of the host's ``MemTotal``. It goes to the usable
host with the most free slots among those with enough free slots and memory. The
caller holds the backend's lock around :meth:`Placement.take` and
:meth:`Placement.give_back`.
"""

from __future__ import annotations

import logging
import math

from fiber.backend import ClusterUnreachableError, JobCreationError, JobSpec
from fiber_ssh.connection import HostConnection

logger = logging.getLogger("fiber.ssh")

Request = tuple[int, "int | None"]


class HostSlots:
    """One host's capacity and what running jobs use of it."""

    def __init__(self, conn: HostConnection) -> None:
        self.conn = conn
        self.slots = conn.spec.slots or 0
        self.memory: int | None = None
        self.used_slots = 0
        self.used_memory = 0
        self.down = False

    def prepare(self) -> None:
        """Connect and read CPU count / memory (errors stay on ``conn.error``)."""
        try:
            self.conn.connect()
        except ClusterUnreachableError as exc:
            self.mark_down(exc)
            return
        self.down = False  # up now, if an earlier try found it down
        try:
            self.conn.probe()
        except ClusterUnreachableError as exc:
            if not self.conn.alive:
                self.mark_down(exc)
                return
            logger.warning("cannot read the CPU count and memory of SSH host %s (%s); "
                           "using %s slot(s), memory unknown", self.conn.spec.name, exc,
                           self.slots or 1)
        if not self.slots:
            self.slots = self.conn.cpus or 1
        self.memory = self.conn.memory
        logger.debug("SSH host %s: %d slots, %s MiB", self.conn.spec.name, self.slots,
                     self.memory)

    def mark_down(self, error: Exception) -> None:
        self.down = True
        if self.conn.error is None:
            self.conn.error = error

    @property
    def usable(self) -> bool:
        return not self.down and self.conn.error is None and self.conn.alive

    @property
    def free_slots(self) -> int:
        return self.slots - self.used_slots

    def fits(self, request: Request) -> bool:
        slots, memory = request
        if self.free_slots < slots:
            return False
        return memory is None or self.memory is None or self.memory - self.used_memory >= memory

    def could_ever_fit(self, request: Request) -> bool:
        slots, memory = request
        return slots <= self.slots and (memory is None or self.memory is None
                                        or memory <= self.memory)


class Placement:
    """Chooses hosts for jobs."""

    def __init__(self, hosts: list[HostSlots]) -> None:
        self.hosts = hosts

    @staticmethod
    def request(spec: JobSpec) -> Request:
        slots = max(1, math.ceil(spec.cpu)) if spec.cpu else 1
        return slots, spec.memory

    def any_usable(self) -> bool:
        return any(host.usable for host in self.hosts)

    def check_fits(self, request: Request, name: str) -> None:
        """Raise when no usable host could ever run the request."""
        usable = [host for host in self.hosts if host.usable]
        if not usable:
            raise ClusterUnreachableError(
                "no SSH host is reachable any more ("
                + "; ".join(f"{h.conn.spec.name}: {h.conn.error}" for h in self.hosts) + ")"
            )
        if not any(host.could_ever_fit(request) for host in usable):
            slots, memory = request
            largest = max(usable, key=lambda h: h.slots)
            raise JobCreationError(
                f"no SSH host can run job {name}: it needs {slots} slot(s)"
                + (f" and {memory} MiB" if memory else "")
                + f" but the largest host, {largest.conn.spec.name}, has {largest.slots} slot(s)"
                + (f" and {largest.memory} MiB" if largest.memory else "")
                + "; lower the job's cpu/memory request or add slots (host entry "
                "user@host:port*slots) or hosts"
            )

    def take(self, request: Request) -> HostSlots | None:
        """Reserve room on the best host, or return ``None`` when none has room."""
        candidates = [host for host in self.hosts if host.usable and host.fits(request)]
        if not candidates:
            return None
        best = max(candidates, key=lambda h: h.free_slots)
        best.used_slots += request[0]
        best.used_memory += request[1] or 0
        return best

    def give_back(self, host: HostSlots, request: Request) -> None:
        host.used_slots -= request[0]
        host.used_memory -= request[1] or 0

    def describe(self) -> str:
        return ", ".join(
            f"{h.conn.spec.name}: {h.used_slots}/{h.slots} used" + ("" if h.usable else " (down)")
            for h in self.hosts
        )
