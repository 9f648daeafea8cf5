"""Estimate pi with a fiber.Pool: the README's first example.

Run it on this machine (``python examples/pi.py``) or on any backend
(``FIBER_BACKEND=docker FIBER_IMAGE=... python examples/pi.py``): the code is the same.
"""

import random
import sys

import fiber


def inside(seed: int, samples: int = 100_000) -> int:
    rnd = random.Random(seed)
    hits = 0
    for _ in range(samples):
        x, y = rnd.random(), rnd.random()
        hits += x * x + y * y <= 1.0
    return hits


if __name__ == "__main__":
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    with fiber.Pool(4) as pool:
        hits = sum(pool.map(inside, range(batches)))
    estimate = 4.0 * hits / (batches * 100_000)
    print(f"pi is about {estimate:.5f} ({batches * 100_000:,} samples, "
          f"backend {fiber.get_config_value('backend')})")
