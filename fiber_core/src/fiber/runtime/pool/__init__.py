"""The machinery behind :class:`fiber.Pool`, by job:

* :mod:`~fiber.runtime.pool.scheduler`: the pending table (queued tasks, the batches
  each worker holds, requeueing on a lost worker), plain bookkeeping;
* :mod:`~fiber.runtime.pool.workers`: the worker set (starting, supervising, resizing
  and ending the worker processes);
* :mod:`~fiber.runtime.pool.channel`: the pool's hub channel, which decodes what workers
  send;
* :mod:`~fiber.runtime.pool.worker`: the loop a worker runs in its job;
* :mod:`~fiber.runtime.pool.results`: the result objects;
* :mod:`~fiber.runtime.pool.feeder`: the thread that reads an ``imap``'s input lazily;
* :mod:`~fiber.runtime.pool.adapt`: the driver of ``Pool.adapt`` (sizes the pool by
  :mod:`~fiber.runtime.pool.adapt_policy`, a pure function of its state).
"""
