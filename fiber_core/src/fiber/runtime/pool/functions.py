"""The functions a pool's tasks call, as the pending table
(:mod:`~fiber.runtime.pool.scheduler`) keeps them for its workers: each pickled once,
known by an id, its pickle kept (the last :data:`FUNC_CACHE` functions) for a worker that
lacks it (a worker is sent a function once, with its first task of it, and caches it).

Functions are known weakly (those that can be referred to weakly: functions,
``functools.partial`` objects, methods): the table keeps no function that neither the
program nor a task of the pool (:attr:`~fiber.runtime.pool.tasks.Task.func`) holds, so
``pool.map(functools.partial(f, big), xs)`` does not keep ``big`` once the call has
returned and the program dropped the partial, as multiprocessing does not. A freed
function's pickle goes at once; its workers are told to drop it with their next batch
(``Worker.forget``), once the table has noted it (:meth:`Functions.func_id`, at the next
call). Others (an ``operator.itemgetter``...) are kept as before, the last
:data:`FUNC_CACHE` of them.

:class:`Functions` is a base class of the table, as :mod:`~fiber.runtime.pool.recall`'s
``Recall`` is: its state lives on the table, so handing out a batch reads
``func_bytes`` as a plain attribute, with no call layer more.
"""

from __future__ import annotations

import collections
import functools
import itertools
import weakref
from collections.abc import Callable
from typing import Any

from fiber.runtime.pool.tasks import Sink, Worker
from fiber.wire import serialization

FUNC_CACHE = 256  # functions whose pickles the pool keeps for workers that lack them


class _Held:
    """A function that cannot be referred to weakly, held: called, it returns it (as a
    weak reference does)."""

    __slots__ = ("func",)

    def __init__(self, func: object) -> None:
        self.func = func

    def __call__(self) -> object:
        return self.func


def _freed(dead: list[int], func_bytes: dict[int, bytes], fid: int, _: object) -> None:
    """A function known weakly was freed (called by the weak reference, on any thread,
    maybe inside a collection): its pickle goes now (a dict's pop is atomic), the rest
    when the table, under its lock, reads ``dead``."""
    func_bytes.pop(fid, None)
    dead.append(fid)


class Functions:
    """The table's functions (see the module's docstring); under the pool's lock."""

    # the table's estimates per function, forgotten with it (scheduler.py)
    fid_seconds: dict[int, float]
    fid_sink: dict[int, weakref.ref[Sink]]  # the map that measured it last
    fid_hist: dict[int, list[int]]
    workers: dict[int, Worker]  # the table's workers alive

    def init_functions(self) -> None:
        """None known yet (the table's ``__init__`` calls it)."""
        self.func_ids = itertools.count()
        # id(func) -> (its weak reference, or a _Held; its id), least recently used first
        self.funcs: collections.OrderedDict[int, tuple[Callable[[], object], int]] = \
            collections.OrderedDict()
        self.func_keys: dict[int, int] = {}  # its id -> id(func)
        self.func_bytes: dict[int, bytes] = {}  # id -> pickle, for workers that lack it
        self.dead_funcs: list[int] = []  # ids of functions freed, not yet forgotten

    def func_id(self, func: Callable[..., Any]) -> int:
        """The id under which workers know ``func`` (pickled once, cached by identity)."""
        if self.dead_funcs:
            self.forget_freed()
        key = id(func)
        entry = self.funcs.get(key)
        if entry is not None and entry[0]() is func:
            self.funcs.move_to_end(key)
            return entry[1]
        code = serialization.dumps_code(func)
        fid = next(self.func_ids)
        ref: Callable[[], object]
        try:
            ref = weakref.ref(func, functools.partial(_freed, self.dead_funcs,
                                                      self.func_bytes, fid))
        except TypeError:  # cannot be referred to weakly: held, the last FUNC_CACHE
            ref = _Held(func)
        self.funcs[key] = (ref, fid)
        self.func_keys[fid] = key
        self.func_bytes[fid] = code
        if len(self.funcs) > FUNC_CACHE:
            _, (_, old) = self.funcs.popitem(last=False)
            self.func_keys.pop(old, None)
            self.func_bytes.pop(old, None)  # workers that have it keep it
            self.fid_seconds.pop(old, None)
            self.fid_sink.pop(old, None)
            self.fid_hist.pop(old, None)
        return fid

    def forget_freed(self) -> None:
        """Forget the functions freed since the last call: their entries, their
        estimates, and, for each worker that has one, tell it with its next batch."""
        dead = self.dead_funcs
        while dead:
            fid = dead.pop()
            key = self.func_keys.pop(fid, None)
            if key is not None:
                entry = self.funcs.get(key)
                if entry is not None and entry[1] == fid:  # (not a later function's)
                    del self.funcs[key]
            self.fid_seconds.pop(fid, None)
            self.fid_sink.pop(fid, None)
            self.fid_hist.pop(fid, None)
            for w in self.workers.values():
                if fid in w.funcs:
                    w.funcs.discard(fid)
                    w.forget.append(fid)

    def func_name(self, fid: int) -> str:
        """The qualified name of the function known as ``fid`` (for an error; a pass
        over the cached functions)."""
        for ref, known in list(self.funcs.values()):
            if known == fid:
                func = ref()
                if func is None:
                    break
                name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
                return str(name) if name else repr(func)
        return f"function #{fid}"
