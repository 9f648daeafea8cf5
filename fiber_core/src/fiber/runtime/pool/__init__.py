"""The machinery behind :class:`fiber.Pool`: the loop a worker runs in its job
(:mod:`~fiber.runtime.pool.worker`) and the result objects
(:mod:`~fiber.runtime.pool.results`)."""
