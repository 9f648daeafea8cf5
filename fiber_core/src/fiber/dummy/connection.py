"""``fiber.dummy.connection``: :mod:`multiprocessing.dummy.connection` as it is
(``Listener``, ``Client`` and ``Pipe`` over queues between threads of this process)."""

from __future__ import annotations

from multiprocessing.dummy.connection import Client, Connection, Listener, Pipe

__all__ = ["Client", "Listener", "Pipe", "Connection"]
