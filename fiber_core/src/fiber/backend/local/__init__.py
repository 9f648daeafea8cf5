"""The built-in ``local`` backend: jobs are processes of this machine
(:mod:`fiber.backend.local.backend`), fiber's own forked from a pre-imported template
(:mod:`fiber.backend.local.forkserver`)."""
