"""fiber.ring.Ring on the selected backend: rendezvous facts, results in rank order,
a failing or dying member stops the ring, and a real torch.distributed gloo
all-reduce (skipped when torch is not installed)."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

import fiber
from fiber.ring import Ring, RingError, context

pytestmark = pytest.mark.timeout(600)


def _facts(rank, world_size):
    ctx = context()
    env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                      "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    return rank, world_size, ctx, env


def _init(marker):
    os.environ["RING_INIT"] = marker


def _initialized(rank, world_size):
    return os.environ.get("RING_INIT")


def _fail_at_one(rank, world_size):
    if rank == 1:
        raise ValueError("member one fails")
    time.sleep(300)


def _die_at_two(rank, world_size):
    if rank == 2:
        os._exit(3)
    time.sleep(300)


def test_members_learn_rank_world_and_rendezvous():
    results = Ring(3, _facts).run(timeout=300)
    assert [r[0] for r in results] == [0, 1, 2]
    assert {r[1] for r in results} == {3}
    for rank, _, ctx, env in results:
        assert ctx.rank == rank and ctx.world_size == 3
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == results[0][2].master_addr
        assert int(env["MASTER_PORT"]) == ctx.master_port > 0
    # local ranks number the members of each host from 0
    local = sorted((r[2].master_addr, r[2].local_rank) for r in results)
    assert len({lr for _, lr in local}) == len(local) or all(
        int(r[3]["LOCAL_WORLD_SIZE"]) < 3 for r in results)


def test_initializer_runs_first():
    assert Ring(2, _initialized, _init, ("ready",)).run(timeout=300) == ["ready", "ready"]


def test_failing_member_stops_the_ring_and_is_named():
    ring = Ring(3, _fail_at_one)
    t0 = time.monotonic()
    with pytest.raises(RingError, match="ring member 1 failed: ValueError") as info:
        ring.run()
    assert info.value.rank == 1
    assert "member one fails" in str(info.value)
    assert time.monotonic() - t0 < 200
    assert not any(m.is_alive() for m in ring.members)


def test_dead_member_stops_the_ring_and_is_named():
    ring = Ring(3, _die_at_two)
    t0 = time.monotonic()
    with pytest.raises(RingError, match="ring member 2 .*exit code 3") as info:
        ring.run()
    assert info.value.rank == 2
    assert time.monotonic() - t0 < 200
    assert not any(m.is_alive() for m in ring.members)


def test_bad_arguments():
    with pytest.raises(ValueError, match="positive int"):
        Ring(0, _facts)
    with pytest.raises(TypeError, match="callable"):
        Ring(2, "not a function")
    with pytest.raises(RuntimeError, match="only available in a ring member"):
        context()


@pytest.fixture
def patient_heartbeat():
    """Importing torch holds the GIL for seconds; four members importing it at once on a
    loaded 2-core machine can starve their heartbeat threads past the default 10 s (the
    parent then ends them as lost, -9). Give them 120 s for this test."""
    before = fiber.get_config_value("heartbeat_timeout")
    fiber.init(heartbeat_timeout=max(before, 120.0))
    try:
        yield
    finally:
        fiber.init(heartbeat_timeout=before)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed (pip install torch==2.13.0 for the CPU "
                           "wheel) - the gloo all-reduce test needs it")
@pytest.mark.usefixtures("patient_heartbeat")
def test_torch_gloo_allreduce_of_four_members():
    assert Ring(4, _sum_of_ranks).run(timeout=500) == [[6.0, 4.0]] * 4


def _sum_of_ranks(rank: int, world_size: int) -> list[float]:
    """A ring member: joins the gloo process group from the variables the Ring set and
    all-reduces ``[rank, 1]``, so every member ends with ``[sum of ranks, members]``."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        values = torch.tensor([float(rank), 1.0])
        dist.all_reduce(values)
        return values.tolist()
    finally:
        dist.destroy_process_group()
