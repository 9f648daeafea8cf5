"""Durable pools: ``fiber.Pool(journal=path)`` journals every result of the pool's
maps and calls in an SQLite file as it arrives, and a program re-run with the same
journal gets the results already journaled back without running them again.

* :mod:`~fiber.runtime.journal.store`: the journal file (locking, batches, checks);
* :mod:`~fiber.runtime.journal.identity`: what makes two pieces of work the same;
* :mod:`~fiber.runtime.journal.registry`: the journals this program has open;
* :mod:`~fiber.runtime.journal.durable`: a pool's durable calls over them.

docs/durable.md says what is journaled, what a crash can lose and how to resume.
"""
