"""uber/fiber's Ring example (its examples/ring.py, shown in its "advanced" docs), in
small: ``fiber.experimental.Ring(n, func, init)``; ``init(ring)`` is given the ring,
waits until ``ring.members[0]`` is connected, points torch.distributed at that member's
``ip`` and ``port`` and at the interface of
``fiber.backend.get_backend().get_listen_addr()``, and joins the gloo process group;
then ``func(rank, size)`` all-reduces a tensor (the example trains a small net on MNIST
with ``@fiber.meta(gpu=1)``; here a sum, on CPU)."""

import os
import time

import torch
import torch.distributed as dist

import fiber
from fiber.experimental import Ring


@fiber.meta(cpu=1)
def ring_sum(rank, size):
    tensor = torch.tensor([float(rank + 1), 1.0])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    print("rank", dist.get_rank(), "of", size, "sum", tensor.tolist(), flush=True)
    dist.destroy_process_group()


def ring_init(ring):
    from fiber.backend import get_backend

    backend = get_backend()
    master = ring.members[0]
    if ring.rank != 0:
        wait = 0.1
        while master.connected is False:
            time.sleep(wait)
            wait = wait * 2
            master = ring.members[0]
    _, _, ifce = backend.get_listen_addr()
    os.environ["MASTER_ADDR"] = master.ip
    os.environ["MASTER_PORT"] = str(master.port)
    os.environ["GLOO_SOCKET_IFNAME"] = ifce
    dist.init_process_group("gloo", rank=ring.rank, world_size=ring.size)


def main():
    ring = Ring(2, ring_sum, ring_init)
    ring.run()
    print("ring done")


if __name__ == "__main__":
    main()
