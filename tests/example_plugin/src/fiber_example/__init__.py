"""A complete third-party fiber backend, written as the tutorial of
docs/writing-a-backend.md: jobs are processes of this machine kept in a spool
directory, the way a batch scheduler keeps its jobs, so that any process of the user
can list, watch and end them. It uses only fiber's public contract (``fiber.backend``)
and passes fiber's backend suite (``pytest --fiber-backend example``)."""
