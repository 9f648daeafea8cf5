"""The ``progress`` setting: a progress bar for a long ``map``/``imap`` of a Pool.

Off by default. When it is on, each map's result object is wrapped in a
:class:`Counted` sink (a counter; the pool's table calls it once per task result, only
while the setting is on) and a daemon thread watches it: if the map is still running
after :data:`DELAY` seconds, it shows a bar, updated a few times a second, until every
task has finished (or the map failed, or the pool was terminated). The bar is labelled
by the call (``fiber imap``, ``fiber map``, ``fiber starmap_async``...), and its clock
counts from the call, not from the bar's appearance. It advances as results arrive:
item by item where a task is one item (``imap``'s default chunksize of 1, any
``chunksize=1``), a chunk at a time otherwise: a chunk is one task to its worker, which
sends the chunk's results together when it is done (that is what chunks are for: a
message per chunk, not per item; ``chunksize=1`` makes the bar smooth at that cost).
Where:

* stderr is a terminal: a ``rich`` progress bar on stderr (``tqdm`` when rich is not
  installed);
* in a Jupyter notebook (``ipykernel`` loaded): ``tqdm.auto``'s widget (rich when tqdm
  is not installed);
* anywhere else (output to a file or a pipe, a job of a cluster): nothing.

The setting needs one of the two libraries: a pool created with it on and neither
installed raises :class:`~fiber.errors.ConfigError` naming the install command (a
setting that silently does nothing would look like a broken bar). ``rich`` comes with
fiber-core's ``top`` extra.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import weakref
from typing import Any

from fiber import threads
from fiber.errors import ConfigError
from fiber.runtime import config

__all__ = ["DELAY", "Counted", "INSTALL_HINT", "enabled", "watch"]

DELAY = 2.0  # seconds a map runs before its bar appears
_REFRESH = 0.2

INSTALL_HINT = ("install rich (fiber-core's `top` extra): from a clone of fiber, "
                "`pip install './fiber_core[top]'`; once fiber-core is on PyPI, "
                "`pip install 'fiber-core[top]'` (or `pip install rich`, or tqdm)")


def _installed(name: str) -> bool:
    if name in sys.modules:  # imported, or hidden (None)
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


def enabled() -> bool:
    """Whether maps show a progress bar (the ``progress`` setting); raises
    ConfigError when it is on and neither rich nor tqdm is installed."""
    if not config.get_config().progress:
        return False
    if not (_installed("rich") or _installed("tqdm")):
        raise ConfigError(f"the progress setting is on, but neither rich nor tqdm is "
                          f"installed to draw the bar: {INSTALL_HINT}")
    return True


class Counted:
    """A result sink that counts what it is given, then hands it on. The last result
    closes the bar (if one is shown) before it is handed on, so the bar is complete
    before the program goes on past its map."""

    __slots__ = ("sink", "total", "done", "bar", "lock", "ends_on_error", "started",
                 "__weakref__")

    def __init__(self, sink: Any, total: int) -> None:
        self.started = time.monotonic()  # the call (the bar's clock counts from here)
        self.sink = sink
        self.total = total
        self.done = 0
        self.bar: _Bar | None = None
        self.lock = threading.Lock()
        # a map's result ends at its first error (an imap's iteration goes on)
        self.ends_on_error = isinstance(getattr(sink, "_ready", None), bool)

    def _set(self, start: int, count: int, ok: bool, value: Any) -> None:
        self.done += count
        if self.bar is not None and (self.done >= self.total or (
                not ok and self.ends_on_error)):
            self.close_bar()
        self.sink._set(start, count, ok, value)

    def close_bar(self) -> None:
        with self.lock:
            bar, self.bar = self.bar, None
            if bar is not None:
                bar.update(self.done)
                bar.close()


def watch(sink: Any, total: int, scheduler: Any, call: str = "map") -> Counted:
    """Wrap ``sink`` (the result object of the Pool method ``call``, ``total`` items)
    for counting and start the thread that shows its bar if it runs long."""
    counted = Counted(sink, total)
    if total > 0:
        threads.start("fiber-progress", _run, counted, total, weakref.ref(scheduler),
                      f"fiber {call}",
                      exempt="draws a bar only: the map's results do not pass through it")
    return counted


def _finished(counted: Counted, total: int, scheduler_ref: weakref.ref[Any]) -> bool:
    if counted.done >= total:
        return True
    ready = getattr(counted.sink, "_ready", None)
    if isinstance(ready, bool) and ready:  # a map_async result that failed
        return True
    scheduler = scheduler_ref()
    return scheduler is None or scheduler.state == "TERMINATE"


def _notebook() -> bool:
    return "ipykernel" in sys.modules


class _Bar:
    """A bar of whichever library there is; None from :meth:`open` when there is no
    terminal or notebook to draw it on."""

    def __init__(self, total: int, label: str, started: float) -> None:
        self.total = total
        self.label = label
        self.started = started  # time.monotonic() of the call
        self._rich: Any = None
        self._task: Any = None
        self._tqdm: Any = None

    def open(self) -> _Bar | None:
        notebook = _notebook()
        if not notebook and not _isatty(sys.stderr):
            return None
        use_tqdm = _installed("tqdm") and (notebook or not _installed("rich"))
        if use_tqdm:
            if notebook:
                from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]
            else:
                from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
            self._tqdm = tqdm(total=self.total, desc=self.label, file=sys.stderr)
            # its clock counts from the call (tqdm's own clock is time.time())
            self._tqdm.start_t -= time.monotonic() - self.started
            return self
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._rich = Progress(TextColumn(self.label), BarColumn(),
                              MofNCompleteColumn(), _elapsed_column(self.started),
                              TimeRemainingColumn(),
                              console=Console(file=sys.stderr), transient=False,
                              redirect_stdout=False)  # the program's output stays put
        self._rich.start()
        self._task = self._rich.add_task("map", total=self.total)
        return self

    def update(self, done: int) -> None:
        if self._tqdm is not None:
            self._tqdm.update(done - self._tqdm.n)
        else:
            self._rich.update(self._task, completed=done)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()
        else:
            self._rich.stop()


def _elapsed_column(started: float) -> Any:
    """A rich column of the time since ``started`` (time.monotonic()), H:MM:SS as
    rich's elapsed column shows it, which counts from the bar's start instead."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Elapsed(ProgressColumn):
        def render(self, task: Any) -> Text:
            seconds = int(max(0.0, time.monotonic() - started))
            h, rest = divmod(seconds, 3600)
            m, s = divmod(rest, 60)
            return Text(f"{h}:{m:02d}:{s:02d}", style="progress.elapsed")

    return Elapsed()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _run(counted: Counted, total: int, scheduler_ref: weakref.ref[Any], label: str) -> None:
    deadline = counted.started + DELAY
    while time.monotonic() < deadline:
        if _finished(counted, total, scheduler_ref):
            return
        time.sleep(0.05)
    with counted.lock:
        if _finished(counted, total, scheduler_ref):
            return
        counted.bar = _Bar(total, label, counted.started).open()
    if counted.bar is None:
        return
    try:
        while not _finished(counted, total, scheduler_ref):
            with counted.lock:
                if counted.bar is None:
                    return
                counted.bar.update(counted.done)
            time.sleep(_REFRESH)
    finally:
        counted.close_bar()
