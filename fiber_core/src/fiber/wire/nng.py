"""What the hub and the nng client share of pynng: a context that may outlive its
socket, closing without complaints, and nng kept alive until the process ends."""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable

import pynng

__all__ = ["Context", "close_all", "quiet"]

# pynng finalizes nng at exit, while fiber's daemon threads may still sit in nng
# calls (a blocked recv): nng then aborts the process. The OS reclaims everything at
# exit anyway, so fiber keeps nng alive until the process ends.
try:
    atexit.unregister(pynng.nng._pynng_atexit)
except AttributeError:  # another pynng version: nothing to undo
    pass


# pynng's Context.close checks that the context is open, then reads it: a second
# thread closing it meanwhile made the first raise TypeError (a hub closed while one of
# its contexts was closed by its own thread). Closing is rare: one lock serves all
# (reentrant: a collected context may be closed from a close under way).
_CLOSING = threading.RLock()


class Context(pynng.Context):
    """A pynng context that can be garbage collected after its socket is closed
    (pynng's own raises from ``__del__`` then), and closed by two threads at once."""

    def close(self) -> None:
        with _CLOSING:
            super().close()

    def __del__(self) -> None:
        try:
            self.close()
        except pynng.NNGException:
            pass

    def set_recv_timeout(self, seconds: float | None) -> None:
        """Wait at most ``seconds`` in :meth:`recv` (None: forever)."""
        ms = -1 if seconds is None else max(1, int(seconds * 1000))
        pynng.check_err(pynng.lib.nng_ctx_set_ms(self.context, b"recv-timeout", ms))


def quiet(fn: Callable[[], object]) -> None:
    """Call ``fn()``, ignoring nng's errors (closing what may be closed already)."""
    try:
        fn()
    except pynng.NNGException:
        pass


def close_all(contexts: weakref.WeakSet[Context], sock: pynng.Socket) -> None:
    """Close contexts before their socket (pynng complains the other way round)."""
    for ctx in list(contexts):
        quiet(ctx.close)
    quiet(sock.close)
