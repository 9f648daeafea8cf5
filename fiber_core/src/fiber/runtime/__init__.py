"""The runtime of job-backed processes, between the public API and the wire.

* :mod:`~fiber.runtime.run`: this process's run, backend, listen address and hub;
* :mod:`~fiber.runtime.config`: the effective settings;
* :mod:`~fiber.runtime.popen` (the parent's side of a job), :mod:`~fiber.runtime.bootstrap`
  (the job's side), :mod:`~fiber.runtime.monitor` (job statuses);
* :mod:`~fiber.runtime.mailbox`, :mod:`~fiber.runtime.endpoint`,
  :mod:`~fiber.runtime.pipes`: the brokers behind queues and pipes;
* :mod:`fiber.runtime.pool`: the machinery behind :class:`fiber.Pool`.
"""
