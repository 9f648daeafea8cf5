"""uber/fiber 0.2's form of a Ring initializer, kept so its programs run (its Ring
example: ``Ring(n, func, init)`` with ``def init(ring)``). Deprecated: fiber's
:class:`fiber.ring.Ring` calls ``initializer(*initargs)`` and a member reads the ring's
facts from :func:`fiber.ring.context` (or torch.distributed's variables, which it sets).

uber/fiber called the initializer with the Ring object itself; its example reads
``ring.rank``, ``ring.size`` and ``ring.members[0]`` (``connected``, ``ip``, ``port``:
where rank 0 listens). :func:`call_initializer` passes such a view (:class:`RingView`)
when, and only when, fiber's form cannot be called: no ``initargs`` were given and the
initializer needs exactly one positional argument. The view is built after the
rendezvous, so every member is ``connected``; ``ip`` and ``port`` are known for rank 0
(the ring's master address) and ``None`` for the others, which uber/fiber's example
does not read.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fiber import util

__all__ = ["RingNode", "RingView", "takes_the_ring", "call_initializer"]


@dataclass
class RingNode:
    """A ring member as uber/fiber's ``fiber.experimental.ring.RingNode``."""

    rank: int
    connected: bool = False
    ip: str | None = None
    port: int | None = None


@dataclass
class RingView:
    """What uber/fiber's initializer was given (its Ring): ``rank``, ``size``,
    ``members``."""

    rank: int
    size: int
    members: list[RingNode] = field(default_factory=list)


def takes_the_ring(initializer: Callable[..., object], initargs: tuple[Any, ...]) -> bool:
    """Whether ``initializer`` is uber/fiber's form: called with ``*initargs`` it could
    not be (there are none), with one positional argument it could."""
    if initargs:
        return False
    try:
        signature = inspect.signature(initializer)
    except (TypeError, ValueError):  # e.g. some builtins: call it fiber's way
        return False
    try:
        signature.bind()
    except TypeError:
        pass
    else:
        return False
    try:
        signature.bind(None)
    except TypeError:
        return False
    return True


def call_initializer(initializer: Callable[..., object], initargs: tuple[Any, ...],
                     rank: int, size: int, master: tuple[str, int]) -> None:
    """In ring member ``rank`` of ``size``, whose master listens at ``master``:
    ``initializer(*initargs)``, or ``initializer(ring)`` with a :class:`RingView` when
    it is uber/fiber's form (deprecated, warned once)."""
    if not takes_the_ring(initializer, initargs):
        initializer(*initargs)
        return
    util.warn_deprecated(
        "fiber.Ring initializer(ring)",
        f"a Ring initializer taking the ring ({getattr(initializer, '__name__', '?')}"
        "(ring), uber/fiber's form) is deprecated: fiber.Ring calls "
        "initializer(*initargs); read rank, world size and the master address from "
        "fiber.ring.context() (torch.distributed's MASTER_ADDR, MASTER_PORT, RANK and "
        "WORLD_SIZE are set)", at=initializer)
    members = [RingNode(member, connected=True) for member in range(size)]
    members[0].ip, members[0].port = master
    initializer(RingView(rank, size, members))
