"""Every documented public name of multiprocessing's modules exists in fiber's
counterpart, module by module; the names still missing are listed below, each with
its reason, and the list must stay exact (a name that appears must leave it).

The documented names of a module are its ``__all__`` plus the names the
documentation describes outside it (``queues.Empty``, ``pool.AsyncResult``, ...).
``multiprocessing.context`` has no ``__all__``: its documented API is that of the
context objects and the classes named in the documentation.
"""

from __future__ import annotations

import importlib
import multiprocessing
import multiprocessing.context

import pytest

MODULES = ["", "connection", "context", "dummy", "dummy.connection", "managers", "pool",
           "process", "queues", "reduction", "shared_memory", "sharedctypes", "synchronize",
           "util"]

# names the documentation gives outside the module's __all__
DOCUMENTED_EXTRA = {
    "": {"Barrier"},
    "connection": {"Connection", "Client", "Listener", "wait", "Pipe"},
    "context": {"BaseContext", "DefaultContext", "SpawnContext", "ForkContext",
                "ForkServerContext", "SpawnProcess", "ForkProcess", "ForkServerProcess",
                "Process", "ProcessError", "BufferTooShort", "TimeoutError",
                "AuthenticationError"},
    "managers": {"Namespace", "BaseProxy", "Token", "SyncManager", "BaseManager",
                 "RemoteError"},
    "pool": {"AsyncResult", "RemoteTraceback", "MaybeEncodingError"},
    "queues": {"Empty", "Full"},
    "reduction": {"AbstractReducer"},
    "synchronize": {"Barrier"},
}

# names fiber does not have yet, and why
MISSING: dict[str, set[str]] = {}
# the methods of a context object still missing
MISSING_CONTEXT_METHODS: set[str] = set()


def documented(name: str) -> set[str]:
    module = importlib.import_module("multiprocessing" + (f".{name}" if name else ""))
    names = set(getattr(module, "__all__", ()) or ())
    return names | DOCUMENTED_EXTRA.get(name, set())


@pytest.mark.parametrize("name", MODULES, ids=lambda n: n or "multiprocessing")
def test_fiber_has_the_documented_names(name):
    fiber_module = importlib.import_module("fiber" + (f".{name}" if name else ""))
    missing = {n for n in documented(name) if not hasattr(fiber_module, n)}
    assert missing == MISSING.get(name, set()), (
        f"fiber.{name or ''} lacks {sorted(missing - MISSING.get(name, set()))}; "
        f"listed as missing but present: {sorted(MISSING.get(name, set()) - missing)}")


def test_context_objects_have_multiprocessing_contexts_api():
    import fiber

    for method in ("spawn", "fork", "forkserver"):
        mp_ctx = multiprocessing.get_context(method)
        public = {n for n in dir(mp_ctx) if not n.startswith("_")}
        ctx = fiber.get_context(method)
        missing = {n for n in public if not hasattr(ctx, n)}
        assert missing == MISSING_CONTEXT_METHODS, (method, sorted(missing))


def test_same_names_are_the_same_objects_where_fiber_reuses_multiprocessing():
    """The classes fiber takes from multiprocessing are the very classes, so code
    that catches multiprocessing's catches fiber's."""
    import multiprocessing.dummy
    import multiprocessing.pool

    import fiber.dummy
    import fiber.pool
    import fiber.queues

    assert fiber.pool.RemoteTraceback is multiprocessing.pool.RemoteTraceback
    assert fiber.pool.MaybeEncodingError is multiprocessing.pool.MaybeEncodingError
    assert fiber.pool.ThreadPool is multiprocessing.pool.ThreadPool
    assert fiber.dummy.Pool is multiprocessing.dummy.Pool
    import queue

    assert fiber.queues.Empty is queue.Empty and fiber.queues.Full is queue.Full


def test_fibers_public_looking_names_are_its_api_or_its_submodules():
    """As multiprocessing's: every name of a freshly imported ``fiber`` that does not
    start with ``_`` is in ``__all__`` or is a submodule (before: ``TYPE_CHECKING``,
    ``annotations`` and ``importlib`` looked public, outside ``__all__``)."""
    import subprocess
    import sys

    code = ("import types, fiber\n"
            "print(sorted(n for n in dir(fiber) if not n.startswith('_') and n not in "
            "fiber.__all__ and not isinstance(getattr(fiber, n), types.ModuleType)))\n"
            "print(hasattr(fiber, 'TYPE_CHECKING'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.splitlines() == ["[]", "False"], out
