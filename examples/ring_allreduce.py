"""A torch.distributed all-reduce over a fiber Ring.

Each ring member is a fiber job; the Ring gives it MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE, so ``torch.distributed.init_process_group("gloo")`` needs no arguments.
Member ``r`` contributes the tensor ``[r + 1, 1]``; after the all-reduce every member
must hold ``[n (n + 1) / 2, n]``::

    python examples/ring_allreduce.py --members 4

Needs torch (CPU is enough: ``pip install torch``).
"""

from __future__ import annotations

import argparse
import json
import sys

from fiber.ring import Ring


def allreduce(rank: int, world_size: int) -> list[float]:
    """Run in every member: join the process group, sum a tensor over the ring."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        tensor = torch.tensor([float(rank + 1), 1.0])
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=4)
    args = p.parse_args(argv)
    if args.members < 1:
        p.error("--members must be >= 1")
    results = Ring(args.members, allreduce).run()
    n = args.members
    expected = [n * (n + 1) / 2, float(n)]
    agree = all(r == expected for r in results)
    print(json.dumps({"members": n, "results": results, "expected": expected,
                      "agree": agree}))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
