"""The machinery of shared state: objects a process creates over shared memory
(:mod:`fiber.synchronize`, :mod:`fiber.sharedctypes`, :mod:`fiber.shared_memory`),
used natively by the processes of its host and through their creator by the others
(:mod:`.served`)."""
