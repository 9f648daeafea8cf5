"""Process-wide helpers every layer may use, as :mod:`multiprocessing.util` is for
multiprocessing: the one ordered exit path of a fiber process, its logger, and the
documented names of multiprocessing.util (``Finalize``, ``register_after_fork``,
``is_exiting``, ``get_temp_dir``, ``sub_debug``/``debug``/``info``/``sub_warning``,
``SUBDEBUG``/``SUBWARNING``, ``ForkAwareThreadLock``, ``ForkAwareLocal``,
``close_all_fds_except``) with multiprocessing's semantics. fiber's logger is named
``fiber`` (multiprocessing's is ``multiprocessing``).

**The exit path.** A module that must act when the process exits registers a callback
with :func:`at_exit` and a priority; one :mod:`atexit` handler runs them all, highest
priority first, each once, whatever the order in which modules were imported. The
priorities fiber uses, in the order they run:

=====================  =====  ============================================================
name                   value  what runs
=====================  =====  ============================================================
``MANAGERS``             50   started managers are shut down (their server jobs end)
``FINALIZERS``           45   :class:`Finalize` objects with an ``exitpriority`` >= 0
                              (multiprocessing runs them before it ends its children)
``CHILDREN``             40   daemonic children are terminated, the others joined, and
                              the jobs the cluster still keeps are freed
``LATE_FINALIZERS``      35   :class:`Finalize` objects with a negative ``exitpriority``
``MAILBOXES``            30   items no one will read are dropped (their shared memory)
``SHARED_STATE``         25   the shared objects this process created (locks, values,
                              arrays, shared memory) stop being served to other hosts,
                              and their names are unlinked
``SHARED_MEMORY``        20   this process's shared-memory segments are unlinked, and
                              those of dead processes swept
``CONNECTIONS``          10   connections and listeners are closed
=====================  =====  ============================================================

A module registers only when it has something to do (a manager started, a child
created), so a program that imported fiber and did nothing exits at once.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

__all__ = ["at_exit", "run_exit_callbacks", "get_logger", "log_to_stderr", "flush_std_streams",
           "MANAGERS", "FINALIZERS", "CHILDREN", "LATE_FINALIZERS", "MAILBOXES", "SHARED_STATE",
           "SHARED_MEMORY", "CONNECTIONS",
           # multiprocessing.util's names
           "sub_debug", "debug", "info", "sub_warning", "get_temp_dir",
           "register_after_fork", "is_exiting", "Finalize", "ForkAwareThreadLock",
           "ForkAwareLocal", "close_all_fds_except", "SUBDEBUG", "SUBWARNING",
           "LOGGER_NAME", "DEFAULT_LOGGING_FORMAT", "warn_deprecated", "exit_now"]

MANAGERS = 50
FINALIZERS = 45
CHILDREN = 40
LATE_FINALIZERS = 35
MAILBOXES = 30
SHARED_STATE = 25
SHARED_MEMORY = 20
CONNECTIONS = 10

LOGGER_NAME = "fiber"
DEFAULT_LOGGING_FORMAT = "[%(levelname)s/%(processName)s] %(message)s"
# multiprocessing's extra levels (get_logger() names them)
SUBDEBUG = 5
SUBWARNING = 25

_lock = threading.Lock()
_callbacks: dict[str, tuple[int, Callable[[], None]]] = {}
_registered = False
_exiting = False


class _Anchor:
    """An object that lives as long as the process (see :func:`at_exit`)."""


_anchor = _Anchor()


def at_exit(name: str, priority: int, callback: Callable[[], None]) -> None:
    """Run ``callback()`` when the process exits, before every callback of a lower
    ``priority``. ``name`` identifies the callback: registering a name again replaces
    it (so a module may call this each time it has something to clean up)."""
    global _registered
    with _lock:
        _callbacks[name] = (priority, callback)
        if not _registered:
            # weakref.finalize's own exit hook (it calls the finalizers still alive,
            # and makes every later call of one a no-op) must run after fiber's exit
            # path, which joins children that may still use what those finalizers
            # release: atexit runs last-registered first, so weakref's goes in first
            weakref.finalize(_anchor, int).atexit = False
            atexit.register(run_exit_callbacks)
            _registered = True


def run_exit_callbacks(down_to: int | None = None) -> None:
    """Run every registered callback once, highest priority first (the exit path);
    with ``down_to``, only those of a higher priority (a job, which leaves by
    ``os._exit``, keeps its connections for its last report). A callback that raises
    is logged at debug level; the others still run."""
    global _exiting
    _exiting = True
    with _lock:
        ordered = sorted(((name, entry) for name, entry in _callbacks.items()
                          if down_to is None or entry[0] > down_to),
                         key=lambda item: -item[1][0])
        for name, _ in ordered:
            del _callbacks[name]
    for name, (_, callback) in ordered:
        try:
            callback()
        except Exception:  # noqa: BLE001 - one failing step must not skip the others
            get_logger().debug("exit step %s failed", name, exc_info=True)


def forget_exit_callbacks() -> None:
    """Drop every registered callback: this process was forked from the one that
    registered them, and they act on that process's state (its children, mailboxes,
    connections). What this process makes registers its own."""
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it
    _callbacks.clear()


def is_exiting() -> bool:
    """Whether this process has begun its exit path (as multiprocessing's)."""
    return _exiting


_levels_named = False


def get_logger() -> logging.Logger:
    """The ``fiber`` logger (multiprocessing's is ``multiprocessing``); names the
    ``SUBDEBUG`` and ``SUBWARNING`` levels, as multiprocessing's does."""
    global _levels_named
    if not _levels_named:
        logging.addLevelName(SUBDEBUG, "SUBDEBUG")
        logging.addLevelName(SUBWARNING, "SUBWARNING")
        _levels_named = True
    return logging.getLogger(LOGGER_NAME)


def sub_debug(msg: str, *args: Any) -> None:
    get_logger().log(SUBDEBUG, msg, *args)


def debug(msg: str, *args: Any) -> None:
    get_logger().log(logging.DEBUG, msg, *args)


def info(msg: str, *args: Any) -> None:
    get_logger().log(logging.INFO, msg, *args)


def sub_warning(msg: str, *args: Any) -> None:
    get_logger().log(SUBWARNING, msg, *args)


def log_to_stderr(level: int | str | None = None) -> logging.Logger:
    """Send the ``fiber`` logger's records to stderr (as
    :func:`multiprocessing.log_to_stderr`) and return it."""
    logger = get_logger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(DEFAULT_LOGGING_FORMAT))
    logger.addHandler(handler)
    if level:
        logger.setLevel(level)
    return logger


# -- multiprocessing.util's Finalize ------------------------------------------------------
_finalizer_registry: dict[tuple[int | float, int], Finalize] = {}
_finalizer_counter = itertools.count()


class Finalize:
    """Call ``callback(*args, **kwargs)`` once: when ``obj`` is garbage collected, when
    the Finalize object is called, or (if ``exitpriority`` is not None) at exit, higher
    priorities first and, within one priority, the most recent first; ``exitpriority``
    >= 0 runs before the process ends its children, a negative one after. As
    multiprocessing's, it runs only in the process that created it."""

    def __init__(self, obj: Any, callback: Callable[..., object], args: Iterable[Any] = (),
                 kwargs: Mapping[str, Any] | None = None,
                 exitpriority: int | None = None) -> None:
        if exitpriority is not None and not isinstance(exitpriority, int):
            raise TypeError(f"Exitpriority ({exitpriority!r}) must be None or int, "
                            f"not {type(exitpriority)}")
        if obj is not None:
            self._weakref: weakref.ref[Any] | None = weakref.ref(obj, self)
        elif exitpriority is None:
            raise ValueError("Without object, exitpriority cannot be None")
        else:
            self._weakref = None
        self._callback: Callable[..., object] | None = callback
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._key = (exitpriority, next(_finalizer_counter))
        self._pid = os.getpid()
        _finalizer_registry[self._key] = self  # type: ignore[index]  # None: never at exit
        if exitpriority is not None:
            at_exit("finalizers", FINALIZERS, _run_finalizers_early)
            at_exit("late finalizers", LATE_FINALIZERS, _run_finalizers_late)

    def __call__(self, wr: Any = None) -> Any:
        """Run the callback (once) and return its result; None if it already ran,
        was cancelled, or this is not the process that created the Finalize."""
        try:
            del _finalizer_registry[self._key]  # type: ignore[arg-type]
        except KeyError:
            return None
        if self._pid != os.getpid() or self._callback is None:
            return None
        callback, args, kwargs = self._callback, self._args, self._kwargs
        self._callback = self._weakref = None
        self._args, self._kwargs = (), {}
        return callback(*args, **kwargs)

    def cancel(self) -> None:
        """Do not run the callback."""
        try:
            del _finalizer_registry[self._key]  # type: ignore[arg-type]
        except KeyError:
            pass
        else:
            self._callback = self._weakref = None
            self._args, self._kwargs = (), {}

    def still_active(self) -> bool:
        """Whether the callback has yet to run (and is not cancelled)."""
        return self._key in _finalizer_registry

    def __repr__(self) -> str:
        callback = getattr(self._callback, "__name__", self._callback)
        if callback is None:
            return "<Finalize object, dead>"
        return (f"<Finalize object, callback={callback}, args={self._args}, "
                f"exitpriority={self._key[0]}>")


def _run_finalizers(accept: Callable[[int], bool]) -> None:
    """Run the registered finalizers whose exit priority ``accept``s, highest priority
    (then most recent) first; one that raises is logged, the others still run."""
    keys = sorted((k for k in list(_finalizer_registry)
                   if k[0] is not None and accept(int(k[0]))), reverse=True)
    for key in keys:
        finalizer = _finalizer_registry.get(key)
        if finalizer is None:
            continue
        try:
            finalizer()
        except Exception:  # noqa: BLE001 - as multiprocessing: report, go on
            get_logger().exception("finalizer %r failed", finalizer)


def _run_finalizers_early() -> None:
    _run_finalizers(lambda priority: priority >= 0)


def _run_finalizers_late() -> None:
    _run_finalizers(lambda priority: priority < 0)


# -- the rest of multiprocessing.util ---------------------------------------------------
_afterfork_registry: weakref.WeakValueDictionary[tuple[int, int, Any], Any] = (
    weakref.WeakValueDictionary())
_afterfork_counter = itertools.count()


def register_after_fork(obj: Any, func: Callable[[Any], object]) -> None:
    """Record ``func(obj)`` to run in a child made by forking this process, as
    multiprocessing's. A fiber process is never a fork of its parent (every child is a
    job that starts as multiprocessing's spawn starts one), so, as under spawn, these
    never run in fiber's children; the record goes when ``obj`` does."""
    _afterfork_registry[(next(_afterfork_counter), id(obj), func)] = obj


_temp_dir: list[str] = []
_temp_dir_lock = threading.Lock()


def get_temp_dir() -> str:
    """A temporary directory of this process, made on first use and removed at exit."""
    with _temp_dir_lock:
        if not _temp_dir:
            path = tempfile.mkdtemp(prefix="fiber-")
            _temp_dir.append(path)
            Finalize(None, shutil.rmtree, args=(path, True), exitpriority=-100)
        return _temp_dir[0]


class ForkAwareThreadLock:
    """A lock (as multiprocessing's; fiber's processes are never forks, so it is a
    plain ``threading.Lock``, renewed in a forked child all the same)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acquire = self._lock.acquire
        self.release = self._lock.release
        register_after_fork(self, ForkAwareThreadLock._at_fork_reinit)

    def _at_fork_reinit(self) -> None:
        self._lock._at_fork_reinit()  # type: ignore[attr-defined]  # CPython's lock method

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *args: object) -> None:
        self._lock.release()


class ForkAwareLocal(threading.local):
    """Thread-local data, emptied in a forked child (as multiprocessing's)."""

    def __init__(self) -> None:
        register_after_fork(self, lambda obj: obj.__dict__.clear())

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(self), ()


def flush_std_streams() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``, as multiprocessing does before it starts
    a child (what the parent printed first then shows first); never raises."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


def exit_now(line: str, code: int) -> NoReturn:
    """End this process at once with exit status ``code`` (no cleanup: a job that
    cannot go on), after writing ``line`` to its original stderr (the job's log)."""
    try:
        stream = sys.__stderr__
        if stream is not None:
            stream.write(line + "\n")
            stream.flush()
    finally:
        os._exit(code)


def close_all_fds_except(fds: Iterable[int]) -> None:
    """Close every file descriptor of this process but ``fds`` (as multiprocessing's)."""
    keep = sorted({-1, *fds, os.sysconf("SC_OPEN_MAX")})
    for low, high in zip(keep, keep[1:], strict=False):
        os.closerange(low + 1, high)


# -- deprecated spellings ---------------------------------------------------------------
_warned: set[str] = set()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def warn_deprecated(spelling: str, message: str, at: Callable[..., Any] | None = None) -> None:
    """Warn once per process that ``spelling`` is deprecated (a
    :class:`DeprecationWarning` with ``message``, which names the new spelling),
    attributed to the first caller outside fiber, so Python's default filter shows it
    when that caller is the program's ``__main__``; or, given ``at``, to that function
    of the program (the warning is about a function fiber calls, e.g. in a job whose
    stack is all fiber's), shown when it was defined in ``__main__``."""
    with _lock:
        if spelling in _warned:
            return
        _warned.add(spelling)
    code = getattr(at, "__code__", None)
    if code is not None:
        module = str(getattr(at, "__module__", None) or "")
        if module == "__mp_main__":  # the program's main module, in a child
            module = "__main__"
        warnings.warn_explicit(message, DeprecationWarning, code.co_filename,
                               code.co_firstlineno, module=module)
        return
    level, frame = 2, sys._getframe(1)  # stacklevel 2: the caller of this function
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
        level += 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)
