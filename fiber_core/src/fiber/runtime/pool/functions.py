"""The functions a pool's tasks call, as the pending table
(:mod:`~fiber.runtime.pool.scheduler`) keeps them for its workers: each pickled once,
known by an id, its pickle kept (the last :data:`FUNC_CACHE` functions) for a worker that
lacks it (a worker is sent a function once, with its first task of it, and caches it).

:class:`Functions` is a base class of the table, as :mod:`~fiber.runtime.pool.recall`'s
``Recall`` is: its state lives on the table, so handing out a batch reads
``func_bytes`` as a plain attribute, with no call layer more.
"""

from __future__ import annotations

import collections
import itertools
import weakref
from collections.abc import Callable
from typing import Any

from fiber.runtime.pool.tasks import Sink
from fiber.wire import serialization

FUNC_CACHE = 256  # functions whose pickles the pool keeps for workers that lack them


class Functions:
    """The table's functions (see the module's docstring); under the pool's lock."""

    # the table's estimates per function, forgotten with it (scheduler.py)
    fid_seconds: dict[int, float]
    fid_sink: dict[int, weakref.ref[Sink]]  # the map that measured it last
    fid_hist: dict[int, list[int]]

    def init_functions(self) -> None:
        """None known yet (the table's ``__init__`` calls it)."""
        self.func_ids = itertools.count()
        # id(func) -> (func, its id, its pickle), least recently used first
        self.funcs: collections.OrderedDict[int, tuple[object, int, bytes]] = \
            collections.OrderedDict()
        self.func_bytes: dict[int, bytes] = {}  # id -> pickle, for workers that lack it

    def func_id(self, func: Callable[..., Any]) -> int:
        """The id under which workers know ``func`` (pickled once, cached by identity)."""
        key = id(func)
        entry = self.funcs.get(key)
        if entry is not None and entry[0] is func:
            self.funcs.move_to_end(key)
            return entry[1]
        code = serialization.dumps_code(func)
        fid = next(self.func_ids)
        self.funcs[key] = (func, fid, code)
        self.func_bytes[fid] = code
        if len(self.funcs) > FUNC_CACHE:
            _, (_, old, _) = self.funcs.popitem(last=False)
            self.func_bytes.pop(old, None)  # workers that have it keep it
            self.fid_seconds.pop(old, None)
            self.fid_sink.pop(old, None)
            self.fid_hist.pop(old, None)
        return fid

    def func_name(self, fid: int) -> str:
        """The qualified name of the function known as ``fid`` (for an error; a pass
        over the cached functions)."""
        for func, known, _ in list(self.funcs.values()):
            if known == fid:
                name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
                return str(name) if name else repr(func)
        return f"function #{fid}"
