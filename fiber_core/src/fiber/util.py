"""Process-wide helpers every layer may use, as :mod:`multiprocessing.util` is for
multiprocessing: the one ordered exit path of a fiber process and its logger.

**The exit path.** A module that must act when the process exits registers a callback
with :func:`at_exit` and a priority; one :mod:`atexit` handler runs them all, highest
priority first, each once, whatever the order in which modules were imported. The
priorities fiber uses, in the order they run:

=====================  =====  ============================================================
name                   value  what runs
=====================  =====  ============================================================
``MANAGERS``             50   started managers are shut down (their server jobs end)
``CHILDREN``             40   daemonic children are terminated, the others joined, and
                              the jobs the cluster still keeps are freed
``MAILBOXES``            30   items no one will read are dropped (their shared memory)
``SHARED_MEMORY``        20   this process's shared-memory segments are unlinked, and
                              those of dead processes swept
``CONNECTIONS``          10   connections and listeners are closed
=====================  =====  ============================================================

A module registers only when it has something to do (a manager started, a child
created), so a program that imported fiber and did nothing exits at once.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable

__all__ = ["at_exit", "run_exit_callbacks", "get_logger", "log_to_stderr",
           "MANAGERS", "CHILDREN", "MAILBOXES", "SHARED_MEMORY", "CONNECTIONS"]

MANAGERS = 50
CHILDREN = 40
MAILBOXES = 30
SHARED_MEMORY = 20
CONNECTIONS = 10

LOGGER_NAME = "fiber"

_lock = threading.Lock()
_callbacks: dict[str, tuple[int, Callable[[], None]]] = {}
_registered = False


def at_exit(name: str, priority: int, callback: Callable[[], None]) -> None:
    """Run ``callback()`` when the process exits, before every callback of a lower
    ``priority``. ``name`` identifies the callback: registering a name again replaces
    it (so a module may call this each time it has something to clean up)."""
    global _registered
    with _lock:
        _callbacks[name] = (priority, callback)
        if not _registered:
            atexit.register(run_exit_callbacks)
            _registered = True


def run_exit_callbacks() -> None:
    """Run every registered callback once, highest priority first (the exit path).
    A callback that raises is logged at debug level; the others still run."""
    with _lock:
        ordered = sorted(_callbacks.items(), key=lambda item: -item[1][0])
        _callbacks.clear()
    for name, (_, callback) in ordered:
        try:
            callback()
        except Exception:  # noqa: BLE001 - one failing step must not skip the others
            get_logger().debug("exit step %s failed", name, exc_info=True)


def get_logger() -> logging.Logger:
    """The ``fiber`` logger (multiprocessing's is ``multiprocessing``)."""
    return logging.getLogger(LOGGER_NAME)


def log_to_stderr(level: int | str | None = None) -> logging.Logger:
    """Send the ``fiber`` logger's records to stderr (as
    :func:`multiprocessing.log_to_stderr`) and return it."""
    logger = get_logger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
    logger.addHandler(handler)
    if level:
        logger.setLevel(level)
    return logger
