"""Shipping a program to hosts that have only a Python interpreter (issue #38).

The parent packs what its jobs need and cannot see (its code, fiber-core, the
backend's plugin, the packages the ``ship`` setting names) into content-addressed
archives, offers them on its hub, and gives each job a tiny standard-library stub as
its command: the stub proves the run's secret, fetches what the host's cache lacks,
unpacks it atomically, and hands over to fiber's bootstrap. The parts:

- :mod:`.plan`: the setting, the decision (``auto``: only when the backend's jobs do
  not share this machine's files), the job's command and environment;
- :mod:`.code`: which of the program's own files travel (roots, ``.gitignore``);
- :mod:`.packages`: which installed distributions travel, and their files;
- :mod:`.archive`: the archives, their keys, the size limit, the store of sent ones;
- :mod:`.serving`: the hub channel the stubs fetch from;
- :mod:`.stub`: what the job runs first (standard library only);
- :mod:`.localize`: the bootstrap's mapping of the parent's paths to the host's.

Nothing here names a cluster: a backend only says whether its jobs share this
machine's files (:attr:`fiber.backend.Backend.shares_files`).
"""
