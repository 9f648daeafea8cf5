"""uber/fiber's pi estimation: Monte Carlo samples counted by a fiber Pool."""

import random

import fiber


def inside(_):
    x, y = random.random(), random.random()
    return x * x + y * y < 1


if __name__ == "__main__":
    samples = 20000
    pool = fiber.Pool(processes=2)
    count = sum(pool.map(inside, range(samples)))
    pool.close()
    pool.join()
    pi = 4.0 * count / samples
    print("pi is roughly", pi)
    print("within 0.1:", abs(pi - 3.14159) < 0.1)
