"""A minimal third-party fiber backend: jobs are subprocesses started with a marker
variable, written only against fiber's public contract (job, backend, hookspecs)."""
