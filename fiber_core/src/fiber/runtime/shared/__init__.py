"""The machinery of shared state: objects a process creates over shared memory
(:mod:`fiber.synchronize`, :mod:`fiber.sharedctypes`, :mod:`fiber.shared_memory`),
used natively by the processes of its host and through their creator by the others
(:mod:`.served`). :mod:`.buffers` and :mod:`.semaphores` hold the memory and the named
semaphores; :mod:`.sync_proxies` and :mod:`.ctypes_proxies` what the primitives and the
ctypes objects are through their creator."""
