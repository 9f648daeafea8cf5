"""The machinery behind :mod:`fiber.managers` (and the servers through which a process
serves its shared objects to other hosts, :mod:`fiber.runtime.shared.served`).

* :mod:`.stdlib`: every name taken from the standard library's internals;
* :mod:`.connection`: the ``"fiber"`` serializer (connections to a manager's server);
* :mod:`.proxies`: proxies, their pickling, auto proxies and asynchronous calls;
* :mod:`.server`: a manager's server job (waiting for its address, shutting it down);
* :mod:`.sync`: the types SyncManager serves.

Nothing here imports the API modules (:mod:`fiber.process`, :mod:`fiber.connection`...):
what needs them receives them from :mod:`fiber.managers`.
"""
