"""fiber: the multiprocessing API for a whole computer cluster.

``import fiber as multiprocessing`` and the same Process, Queue, Pipe, Pool and
Manager code runs on the local machine or as jobs on a cluster backend, selected by
``FIBER_BACKEND`` (or ``.fiberconfig``, or ``fiber.init(backend=...)``).
"""

from __future__ import annotations

from fiber.context import *  # noqa: F403 - the public API is defined there
from fiber.context import __all__  # noqa: F401

__version__ = "0.1.0"
