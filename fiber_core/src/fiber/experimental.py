"""``fiber.experimental``: where uber/fiber 0.2 kept ``Ring``. Deprecated: the name is
``fiber.Ring`` (:mod:`fiber.ring`); importing it from here warns once.

Differences from uber/fiber's Ring: ``initializer`` is called with ``*initargs`` in
each member before ``func``, and each member finds the ring's address in
torch.distributed's variables (``MASTER_ADDR``, ...) or in :func:`fiber.ring.context`;
an initializer of uber/fiber's form (``init(ring)``, called with the Ring object) is
still given what uber/fiber's example reads of the ring (:mod:`fiber.uber_ring`), with
a DeprecationWarning.
"""

from __future__ import annotations

from typing import Any

from fiber import util

__all__ = ["Ring"]  # noqa: F822 - made on first use, by __getattr__


def __getattr__(name: str) -> Any:
    if name == "Ring":
        util.warn_deprecated("fiber.experimental.Ring",
                             "fiber.experimental.Ring is deprecated: use fiber.Ring")
        from fiber.ring import Ring

        return Ring
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
