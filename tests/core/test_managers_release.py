"""A manager nobody holds any more is shut down, as multiprocessing's are: its server
job ends once the manager and its proxies are dropped (BaseManager's and
AsyncManager's alike; an AsyncManager's proxies once kept theirs alive until exit)."""

from __future__ import annotations

import gc
import time

import pytest

import fiber
from fiber.managers import AsyncManager, BaseManager

pytestmark = pytest.mark.timeout(300)


class Thing:
    def __init__(self, n: int = 0) -> None:
        self.n = n

    def get(self) -> int:
        return self.n


class ThingAsyncManager(AsyncManager):
    pass


class ThingManager(BaseManager):
    pass


ThingAsyncManager.register("Thing", Thing)
ThingManager.register("Thing", Thing)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except (FileNotFoundError, ProcessLookupError):  # (the latter: it ended while read)
        return False


def _use_and_drop(manager_class: type) -> int:
    """Start a manager, make proxies and call them; return its server's pid (the
    manager and its proxies go when this returns)."""
    manager = manager_class()
    manager.start()
    things = [manager.Thing(i) for i in range(3)]
    values = [thing.get() for thing in things]
    if manager_class is ThingAsyncManager:
        values = [handle.get(60) for handle in values]
        things[1].get()  # a handle dropped unread
    assert values == [0, 1, 2]
    return manager.process.pid


def _servers_left(pids: list[int], timeout: float = 60) -> tuple[list[int], list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        children = [p.name for p in fiber.active_children()
                    if p.name in ("ThingAsyncManager", "ThingManager")]
        if (not alive and not children) or time.monotonic() > deadline:
            return alive, children
        time.sleep(0.1)


@pytest.mark.parametrize("manager_class", [ThingAsyncManager, ThingManager])
def test_dropped_managers_end_their_servers(manager_class):
    pids = [_use_and_drop(manager_class) for _ in range(5)]
    assert len(set(pids)) == 5
    gc.collect()
    alive, children = _servers_left(pids)
    assert alive == [], f"servers still running: {alive}"
    assert children == [], f"manager processes still listed: {children}"


def test_a_dropped_async_manager_goes_without_the_cycle_collector():
    """Its proxies hold no reference cycle: dropping them frees the manager at once."""
    gc.disable()
    try:
        pid = _use_and_drop(ThingAsyncManager)
        alive, children = _servers_left([pid])
    finally:
        gc.enable()
    assert (alive, children) == ([], [])


def test_a_servers_prints_come_before_the_callers_next_line(run_script):
    """What a manager's server prints in a method reaches the terminal before the
    line the caller prints after the call returns (the server's output and its reply
    travel by different routes; the reply waits for the output)."""
    out = run_script("""
        import fiber
        from fiber.managers import BaseManager

        class Talker:
            def say(self, i):
                print(f"server {i}")
                return i

        class M(BaseManager):
            pass

        M.register("Talker", Talker)

        if __name__ == "__main__":
            with M() as m:
                t = m.Talker()
                for i in range(30):
                    t.say(i)
                    print(f"caller {i}", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    expected = [line for i in range(30) for line in (f"server {i}", f"caller {i}")]
    assert lines == expected
