"""The fault-injection tests' shared machinery (#17): a long ``Pool.map`` while one
thread SIGKILLs the pool's workers at random and another takes the cluster manager
away for a while, then the accounting every backend's fault test asserts.

Used by tests/core/test_faults.py (local backend, template kills), tests/ssh,
tests/slurm, tests/docker and tests/k8s ``test_*faults.py``, and by bench/faults.py.
Nothing here is faked: the kills are real signals, the outage is whatever real action
the caller passes (a SIGSTOP of slurmctld, dockerd, kube-apiserver or the local
backend's template; an SSH host's link cut), and executions are counted by the tasks
themselves (a file, or a fiber Queue where jobs do not share the file system).
"""

from __future__ import annotations

import collections
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SHM = "/dev/shm"
_SEGMENT = re.compile(r"fiber-(?:st-)?\d+-(\d+)-(?:(\d+)-)?")


def record(path: str, i: int) -> int:
    """A task of 20 ms that appends its number to the file ``path`` once it is complete
    (``O_APPEND``: one line per execution, also from many processes at once)."""
    time.sleep(0.02)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i * i


def executions_in(path: str) -> collections.Counter:
    """How many times each task ran, from the file :func:`record` writes."""
    with open(path) as f:
        return collections.Counter(int(line) for line in f.read().split())


def busy_workers(pool: Any, exclude: Iterable[int] = ()) -> list[int]:
    """Pids of the pool's workers that hold tasks now (its ``stats()``), except
    ``exclude`` (those already killed)."""
    skip = set(exclude)
    return [w.process.pid for w in pool.stats().workers
            if w.state == "busy" and w.process is not None and w.process.pid
            and w.process.pid not in skip]


def job_processes(run: str) -> list[int]:
    """Pids, on this machine, of the job processes of run ``run`` (found by the run id
    in their environment and fiber's bootstrap on their command line): the workers of a
    pool on a backend whose jobs are processes of this machine in other pid namespaces
    (containers, pods), whose own pids mean nothing here."""
    marker = f"_FIBER_RUN={run}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if marker in environ.split(b"\0") and b"fiber.runtime.bootstrap" in cmdline:
            pids.append(int(entry))
    return pids


def sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Faults:
    """What happened during :func:`map_under_faults`."""

    kills: list[int] = field(default_factory=list)  # pids killed, in order
    killed_in_outage: list[int] = field(default_factory=list)
    outage_began: float | None = None  # monotonic times
    outage_ended: float | None = None
    seconds: float = 0.0  # the map's wall time


def map_under_faults(pool: Any, fn: Callable[[int], Any], n: int, *,
                     victims: Callable[[list[int]], list[int]] | None = None,
                     kills: int = 0, every: float = 0.7, seed: int = 23,
                     kill: Callable[[int], None] = sigkill,
                     freeze: Callable[[], None] | None = None,
                     thaw: Callable[[], None] | None = None,
                     outage_after: float = 2.0, outage_seconds: float = 10.0,
                     chunksize: int = 1) -> tuple[list[Any], Faults]:
    """``pool.map(fn, range(n), chunksize)`` while ``kills`` workers are killed, one
    every ``every`` seconds (a random choice among ``victims(already_killed)``, by
    default the pool's busy workers), and, if ``freeze`` is given, ``freeze()`` runs
    ``outage_after`` s into the map and ``thaw()`` ``outage_seconds`` later (or when
    the map ends; ``thaw`` also runs when anything fails, so an engine is never left
    frozen). Returns the map's result and what happened."""
    faults = Faults()
    stop = threading.Event()
    outage = threading.Event()
    pick = victims or (lambda killed: busy_workers(pool, killed))

    def killer() -> None:
        rnd = random.Random(seed)
        while len(faults.kills) < kills and not stop.wait(every):
            live = pick(list(faults.kills))
            if live:
                pid = rnd.choice(live)
                kill(pid)
                faults.kills.append(pid)
                if outage.is_set():
                    faults.killed_in_outage.append(pid)

    def freezer() -> None:
        assert freeze is not None and thaw is not None
        if stop.wait(outage_after):
            return
        freeze()
        outage.set()
        faults.outage_began = time.monotonic()
        try:
            stop.wait(outage_seconds)
        finally:
            thaw()
            outage.clear()
            faults.outage_ended = time.monotonic()

    threads = [threading.Thread(target=killer, name="fault-killer")]
    if freeze is not None:
        threads.append(threading.Thread(target=freezer, name="fault-freezer"))
    started = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        result = pool.map(fn, range(n), chunksize=chunksize)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        if freeze is not None and thaw is not None:
            thaw()  # idempotent for every caller: SIGCONT, a link set up
    faults.seconds = time.monotonic() - started
    return result, faults


def check_exactly_once(result: list[Any], n: int, runs: collections.Counter,
                       faults: Faults, *, outage: bool = True,
                       expected: Callable[[int], Any] = lambda i: i * i,
                       extra_duplicates: int = 0) -> int:
    """The accounting of issue #17: every result right and in order; every task ran to
    its end; the outage (when there was one) happened during the map with a worker
    killed in it; duplicate executions no more than the kills (a killed worker re-runs
    only its task in progress) plus ``extra_duplicates``. Returns the duplicates."""
    assert result == [expected(i) for i in range(n)]
    if outage:
        assert faults.outage_ended is not None, "the map ended before the outage"
        assert faults.killed_in_outage, ("no worker was killed during the outage",
                                         faults.kills)
    assert faults.kills, "no worker was killed"
    assert set(runs) == set(range(n)), sorted(set(range(n)) - set(runs))[:20]
    duplicates = sum(count - 1 for count in runs.values())
    assert duplicates <= len(faults.kills) + extra_duplicates, (
        duplicates, len(faults.kills), sorted(i for i, c in runs.items() if c > 1)[:50])
    return duplicates


def shm_names() -> set[str]:
    """fiber's names in /dev/shm now (segments, shared objects and their semaphores)."""
    try:
        return {name for name in os.listdir(SHM) if "fiber-" in name}
    except OSError:
        return set()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2][1:2] not in (b"Z", b"X")
    except OSError:
        return False


def dead_segments(before: set[str], timeout: float = 10.0) -> list[str]:
    """Names in /dev/shm made since ``before`` whose creating processes are all gone,
    still there after ``timeout`` s (what a killed process could leave behind; fiber
    sweeps them)."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for name in sorted(shm_names() - before):
            match = _SEGMENT.search(name)
            if match is None:
                continue
            pids = [int(p) for p in match.groups() if p]
            if not any(alive(pid) for pid in pids):
                left.append(name)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)
