"""fiber's backend suite, shipped for backend authors: the contract
(``test_contract``) and the portable tests of the multiprocessing API on a backend.
Run it with ``pytest --fiber-backend NAME`` (see :mod:`fiber.testing.plugin`)."""
