"""Single keys from the terminal while a live view (``fiber top``) is drawn.

:class:`Keys` puts the terminal of standard input in cbreak mode without echo while it
is entered: a key is readable as soon as it is typed, and it is not echoed into the
view. Ctrl-C still raises :class:`KeyboardInterrupt` (signals stay on). The settings
are restored when it exits, however it exits (a key, Ctrl-C, an error). When standard
input is not a terminal (a pipe, a file, ``/dev/null``), nothing is changed and no key
is ever read: :meth:`Keys.wait` only waits.
"""

from __future__ import annotations

import os
import select
import sys
import time
from types import TracebackType
from typing import Any

__all__ = ["Keys"]


class Keys:
    """``with Keys() as keys: key = keys.wait(seconds)``."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._saved: list[Any] | None = None

    def __enter__(self) -> Keys:
        try:
            fd = sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):
            return self  # no real standard input
        if not os.isatty(fd):
            return self
        import termios
        import tty

        self._saved = termios.tcgetattr(fd)
        tty.setcbreak(fd, termios.TCSANOW)  # no line buffering, no echo; signals on
        self._fd = fd
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
        self._fd = self._saved = None

    def wait(self, seconds: float) -> str:
        """Wait up to ``seconds`` for a key; the keys typed ("" when none came)."""
        if self._fd is None:
            time.sleep(seconds)
            return ""
        readable, _, _ = select.select([self._fd], [], [], max(0.0, seconds))
        if not readable:
            return ""
        data = os.read(self._fd, 64)
        if not data:  # the terminal hung up: nothing more will come
            time.sleep(seconds)
            return ""
        return data.decode("utf-8", "replace")
