"""Riding out a backend's transient errors.

A backend says an error is worth another try by raising
:class:`~fiber.errors.TransientBackendError` (or its subclass
:class:`~fiber.errors.ClusterUnreachableError`): an API server's 500 or 429, a
scheduler's time-out, a daemon that restarts, a dropped SSH connection. :func:`call`
repeats such a call with exponential backoff and full jitter (pauses from
:data:`FIRST_PAUSE` doubling up to :data:`LONGEST_PAUSE`, each drawn at random between
half and all of it, so many callers do not hammer a recovering cluster in step; never
less than the error's ``retry_after``, the cluster's own Retry-After) for at most the
``backend_retry_timeout`` setting; then the error is raised, with a note that
says how long it was retried. Any other exception (:class:`~fiber.errors.JobCreationError`:
the cluster refused the request) is raised at once.

An *episode* is the time during which calls of one kind (``"create a job"``) to one
backend fail: its start is logged once as a warning naming the action and the error,
whatever the number of threads retrying, and its end once at info level. A caller may
give up early: a pool's worker set stops retrying the start of a worker nobody needs
any more (the pool was terminated) by installing a pause function with
:func:`pausing`. A caller that does not retry at all, because it reports the failure
itself (an adaptive pool's placement is skipped for a while, with a log line of its
own), calls within :func:`not_retrying`: the first transient error is raised at once,
and no episode is logged for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from fiber.errors import BackendError

logger = logging.getLogger("fiber")

T = TypeVar("T")

#: the first pause after a transient error, seconds
FIRST_PAUSE = 0.25
#: the longest pause between two tries, seconds
LONGEST_PAUSE = 15.0

#: ``pause(seconds) -> stop``: waits, and returns True when the caller no longer wants
#: the call (the default sleeps and returns False)
Pause = Callable[[float], bool]


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


_pause: contextvars.ContextVar[Pause] = contextvars.ContextVar("fiber_retry_pause",
                                                                default=_sleep)
_once: contextvars.ContextVar[bool] = contextvars.ContextVar("fiber_retry_once",
                                                             default=False)


@contextlib.contextmanager
def pausing(pause: Pause) -> Iterator[None]:
    """Within this block (on this thread), :func:`call` waits between tries with
    ``pause`` and gives up as soon as it returns True."""
    token = _pause.set(pause)
    try:
        yield
    finally:
        _pause.reset(token)


@contextlib.contextmanager
def not_retrying() -> Iterator[None]:
    """Within this block (on this thread), :func:`call` raises a transient error at
    once, without logging an episode: the caller says what happened."""
    token = _once.set(True)
    try:
        yield
    finally:
        _once.reset(token)


class _Episode:
    __slots__ = ("since", "callers")

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.callers = 0


_lock = threading.Lock()
_episodes: dict[tuple[str, str], _Episode] = {}


def _begin(key: tuple[str, str], exc: BaseException, budget: float) -> None:
    with _lock:
        episode = _episodes.get(key)
        new = episode is None
        if episode is None:
            episode = _episodes[key] = _Episode()
        episode.callers += 1
    if new:
        logger.warning("the %s backend failed to %s: %s; retrying for up to %.0f s "
                       "(setting backend_retry_timeout)", key[0], key[1], exc, budget)


def _end(key: tuple[str, str], succeeded: bool) -> None:
    with _lock:
        episode = _episodes.get(key)
        if episode is None:
            return
        episode.callers -= 1
        if succeeded or episode.callers <= 0:
            del _episodes[key]
        else:
            return
    if succeeded:
        logger.info("the %s backend can %s again (it failed for %.1f s)", key[0], key[1],
                    time.monotonic() - episode.since)


def call(backend: str, action: str, fn: Callable[[], T], budget: float) -> T:
    """``fn()``, tried again on a transient :class:`BackendError` (a
    :class:`TransientBackendError`, unless raised with ``transient=False``) for up to ``budget``
    seconds; ``backend`` and ``action`` ("create a job") name it in the log."""
    key = (backend, action)
    deadline: float | None = None
    delay = FIRST_PAUSE
    try:
        while True:
            try:
                result = fn()
            except BackendError as exc:
                if not exc.transient:
                    raise  # a refusal, or a setting no retry can mend
                now = time.monotonic()
                if deadline is None:
                    if budget <= 0 or _once.get():
                        raise
                    deadline = now + budget
                    _begin(key, exc, budget)
                left = deadline - now
                if left <= 0:
                    add_note = getattr(exc, "add_note", None)  # Python >= 3.11
                    if add_note is not None:
                        add_note(f"(the {backend} backend failed to {action} for "
                                 f"{budget:.0f} s of retries: see the "
                                 "backend_retry_timeout setting)")
                    raise
                wait = random.uniform(delay / 2, delay)
                if exc.retry_after is not None:  # the cluster said when (Retry-After)
                    wait = max(wait, exc.retry_after)
                wait = min(wait, left)
                delay = min(delay * 2, LONGEST_PAUSE)
                if _pause.get()(wait):
                    raise
                continue
            if deadline is not None:
                _end(key, succeeded=True)
                deadline = None
            return result
    finally:
        if deadline is not None:
            _end(key, succeeded=False)
