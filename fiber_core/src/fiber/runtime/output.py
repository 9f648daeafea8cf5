"""A child's output as the parent writes it: whole lines, in the order the child wrote
them. The child sends what it writes as it flushes (a prompt or a progress dot may
arrive without its newline); the parent writes complete lines at once and keeps a
line's unfinished tail until the rest arrives, the child ends, or ``HOLD`` seconds pass
(so a prompt still shows), so the lines of two children never run into each other."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TextIO

__all__ = ["HOLD", "LineWriter"]

#: seconds an unfinished line is held before it is written as it is
HOLD = 0.5


class LineWriter:
    """The output of one child: ``write(stream, text)`` with stream ``b"1"`` (stdout)
    or ``b"2"`` (stderr); ``prefix`` starts each line (``[name] `` or empty)."""

    def __init__(self, prefix: str, call_later: Callable[[float, Callable[[], None]], None]
                 ) -> None:
        self._prefix = prefix
        self._call_later = call_later
        self._lock = threading.Lock()
        self._tail: dict[bytes, str] = {}
        self._held: dict[bytes, int] = {}  # stream -> generation of the held tail

    def write(self, stream: bytes, text: str) -> None:
        with self._lock:
            data = self._tail.pop(stream, "") + text
            cut = data.rfind("\n") + 1
            whole, tail = data[:cut], data[cut:]
            if whole:
                self._emit(stream, whole)
            if tail:
                self._tail[stream] = tail
                generation = self._held.get(stream, 0) + 1
                self._held[stream] = generation
                self._call_later(HOLD, lambda: self._release(stream, generation))

    def flush(self) -> None:
        """Write every held tail (the child has ended)."""
        with self._lock:
            for stream in list(self._tail):
                self._emit(stream, self._tail.pop(stream))

    def _release(self, stream: bytes, generation: int) -> None:
        with self._lock:
            if self._held.get(stream) == generation and stream in self._tail:
                self._emit(stream, self._tail.pop(stream))

    def _emit(self, stream: bytes, text: str) -> None:
        out: TextIO = sys.stderr if stream == b"2" else sys.stdout
        if self._prefix:
            text = "".join(self._prefix + line for line in text.splitlines(keepends=True))
        try:
            # beneath the text layer when there is one: what this process's own print
            # has written so far of an unfinished line stays in its text layer, so a
            # child's line never lands in the middle of it (multiprocessing's children
            # write to the descriptor, below the parent's buffers, likewise)
            raw = getattr(out, "buffer", None)
            if raw is not None:
                raw.write(text.encode(out.encoding or "utf-8", "backslashreplace"))
                raw.flush()
            else:
                out.write(text)
                out.flush()
        except (OSError, ValueError, AttributeError, LookupError):
            pass
