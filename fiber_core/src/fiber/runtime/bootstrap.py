"""The entry point of every job: ``python -m fiber.runtime.bootstrap``.

It connects to the parent's hub by the hub's stream wire, named in ``_FIBER_PARENT``
(the objects of the parent it receives name the hub by its nng address,
``_FIBER_PARENT_HUB``, and reuse that connection: a job starts no nng unless it makes
a hub of its own), authenticates with the run's secret (``_FIBER_AUTHKEY`` in its
environment, or in the secrets file its backend wrote, ``_FIBER_SECRETS_FILE``, which
it reads first: :mod:`fiber.backend.secrets`), says hello on its control channel
(``_FIBER_CHANNEL``) and receives the parent's preparation data (sys.path, main module, as multiprocessing's spawn sends
them) and the pickled Process object. It forwards its stdout and stderr to the
parent, keeps a heartbeat with it (exiting when the parent is gone, so no job outlives
its parent), runs the process and reports the exit code.

While it imports the parent's main module, starting a process raises RuntimeError
(as multiprocessing's spawn does: a script without the ``if __name__ == "__main__":``
guard would start processes in every job). A failure before the process runs (that
import, unpickling the process object) is sent to the parent with its traceback, which
the parent raises as :class:`fiber.ProcessStartError`; then the job exits.
"""

from __future__ import annotations

import io
import multiprocessing.spawn
import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from fiber import threads, util
from fiber.backend import registry
from fiber.backend.secrets import SecretsFileError, load_secrets
from fiber.errors import ConnectionLostError, FiberThreadError
from fiber.runtime import config, parent_link, run
from fiber.runtime.ship.localize import SHIPPED_ENV, localize
from fiber.wire import auth, protocol, serialization, transport
from fiber.wire.protocol import Control

PARENT_GONE_EXIT = 70


def _parent_gone(reason: str) -> None:
    """The parent is gone: exit, unless the process watches its parent's sentinel
    (:mod:`fiber.runtime.parent_link`), which is made readable and given a grace."""
    if parent_link.gone(reason):
        _exit_parent_gone(reason)


def _exit_parent_gone(reason: str) -> None:
    util.exit_now(f"fiber: parent process is gone ({reason}); exiting", PARENT_GONE_EXIT)


#: seconds the first line written waits for the output thread to run (see _Output)
_START_WAIT = 2.0


class _Output:
    """Sends the lines a job writes to its stdout and stderr (the :class:`_Forwarder`
    streams) to its parent, in the order written, from one thread, in batches.

    The thread starts with the first line to send (most pool workers print nothing:
    starting a thread per stream that waited for output was a tenth of a worker's CPU
    before its first task); that first write waits until the thread runs, so a thread
    that dies as it starts fails it, but for at most :data:`_START_WAIT` seconds (the
    write may come from a logging handler whose lock the dying thread needs to log its
    death before it reports it: then the write goes on, the next one raises). The
    lines a dead thread had not sent go to the job's own streams (its log), as those
    of a thread that cannot reach the parent do. In a process forked from the job (a
    pool's ``workers_per_job``), which does not own the connection, lines go to the
    job's own streams."""

    def __init__(self, client: transport.StreamClient, channel: int,
                 originals: dict[bytes, Any]) -> None:
        self._client = client
        self._channel = channel
        self.originals = originals  # stream (b"1", b"2") -> the job's own stream
        self._pending: list[tuple[bytes, str]] = []
        self.cond = threading.Condition()
        self._sending = False
        self.error: FiberThreadError | None = None  # the thread died: writes raise it
        self._owner = os.getpid()
        self._thread: threading.Thread | None = None
        self._up = False  # the thread runs its loop (or has died)

    def queue(self, stream: bytes, text: str) -> None:
        """Send ``text`` to the parent's ``stream`` (with :attr:`cond` held)."""
        if os.getpid() != self._owner:  # (the thread, if any, is the job's)
            self._write_own([(stream, text)])
            return
        self._pending.append((stream, text))
        if self._thread is not None:
            self.cond.notify()
            return
        self._thread = threads.start("fiber-output", self._run, fails=self._died)
        self.cond.wait_for(lambda: self._up, _START_WAIT)
        if self.error is not None:
            raise self.error

    def settle(self, timeout: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: not self._pending and not self._sending, timeout)

    def _write_own(self, items: list[tuple[bytes, str]]) -> None:
        for stream, text in items:
            try:
                self.originals[stream].write(text)
                self.originals[stream].flush()
            except (OSError, ValueError):
                pass

    def _died(self, error: FiberThreadError) -> None:
        with self.cond:
            self.error = error
            unsent, self._pending = self._pending, []
            self._sending = False
            self._up = True
            self.cond.notify_all()
        self._write_own(unsent)

    def _run(self) -> None:
        ctx = self._client.context()
        with self.cond:
            self._up = True
            self.cond.notify_all()
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self._pending)
                batch, self._pending = self._pending, []
                self._sending = True
            chunks: list[tuple[bytes, list[str]]] = []
            for stream, text in batch:  # runs of one stream, in order
                if chunks and chunks[-1][0] == stream:
                    chunks[-1][1].append(text)
                else:
                    chunks.append((stream, [text]))
            for stream, texts in chunks:
                chunk = "".join(texts)
                try:
                    ctx.request(self._channel,
                                Control.OUTPUT + stream + chunk.encode("utf-8", "replace"))
                except Exception:  # noqa: BLE001 - the parent is gone; keep it in the logs
                    self._write_own([(stream, chunk)])
            with self.cond:
                self._sending = False
                self.cond.notify_all()


class _Forwarder(io.TextIOBase):
    """A text stream whose lines go to the parent's stdout or stderr (``stream``,
    b"1" or b"2"), through the job's :class:`_Output`."""

    def __init__(self, output: _Output, stream: bytes) -> None:
        self._output = output
        self._stream = stream
        self._original = output.originals[stream]
        self._partial = ""

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # read-only in io.TextIOBase at run time (typeshed says writable)
        return "utf-8"

    def fileno(self) -> int:
        return self._original.fileno()

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        output = self._output
        with output.cond:
            if output.error is not None:
                raise output.error
            data = self._partial + text
            cut = data.rfind("\n") + 1
            self._partial = data[cut:]
            if cut:
                output.queue(self._stream, data[:cut])
        return len(text)

    def flush(self) -> None:
        output = self._output
        with output.cond:
            if self._partial and output.error is None:
                partial, self._partial = self._partial, ""
                output.queue(self._stream, partial)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the whole lines written so far have reached the parent (what
        this process sends next, e.g. a manager's reply, then comes after them)."""
        self._output.settle(timeout)

    def drain(self, timeout: float = 10.0) -> None:
        """Flush, then wait until everything written has reached the parent."""
        self.flush()
        self._output.settle(timeout)


def _heartbeat(client: transport.StreamClient, channel: int, interval: float, timeout: float) -> None:
    ctx = client.context()
    while True:
        try:
            reply = ctx.request(channel, Control.WATCH, timeout=interval + timeout)
        except ConnectionLostError as exc:
            _parent_gone(str(exc))
            time.sleep(parent_link.GRACE)  # the process watches the sentinel
            _exit_parent_gone(str(exc))
        if reply == Control.END_KILL:  # the parent ends this job itself: the cluster
            os.kill(os.getpid(), signal.SIGKILL)  # manager may be slow or down
        elif reply == Control.END_TERM:
            os.kill(os.getpid(), signal.SIGTERM)


def _prepare(data: dict) -> None:
    if SHIPPED_ENV in os.environ:  # (its stub put the parent's files elsewhere here)
        data = localize(data)
    if not os.path.isdir(data.get("dir", "")):
        data.pop("dir", None)
    path = data.get("init_main_from_path")
    if path and not os.path.exists(path):
        data.pop("init_main_from_path")
    data.pop("start_method", None)
    multiprocessing.spawn.prepare(data)


def _report_failure(client: transport.StreamClient, channel: int, out: _Forwarder,
                    err: _Forwarder) -> int:
    """The job failed before running its process: send the traceback to the parent,
    which prints it (once, however many jobs fail alike: a pool's workers all do) and
    raises it as ProcessStartError. Printed here too, it would show once per job."""
    text = traceback.format_exc()
    out.drain()
    err.drain()
    try:
        client.request(channel, Control.FAILED + text.encode("utf-8", "replace"), timeout=30)
    except ConnectionLostError:
        pass
    return 1


def main() -> int:
    registry.quiet_in_jobs()  # a broken plugin: the program's main process warned
    try:
        # the run's secret, when its backend delivered it in a secrets file: into this
        # process's environment, where the wire finds it (fiber.backend.secrets)
        load_secrets()
    except SecretsFileError as exc:
        sys.stderr.write(f"fiber: this job cannot join its run: {exc}\n")
        return 1
    auth.take_from_environment()  # in memory only: a task's subprocesses do not inherit it
    address = os.environ.pop("_FIBER_PARENT")
    hub_address = os.environ.pop("_FIBER_PARENT_HUB", None)
    channel = int(os.environ.pop("_FIBER_CHANNEL"))
    cfg = config.get_config()  # a bad setting fails here, before the parent counts on us
    client = transport.StreamClient(address,
                                    on_lost=lambda: _parent_gone("connection closed"))
    transport.register_client(client)  # objects of the parent reuse this connection
    if hub_address:  # (they name the parent's hub by its nng address)
        transport.reach_by_stream(hub_address, address)
    try:
        body = (_hello(os.getpid()) if _hello is not None
                else protocol.hello(os.getpid(), socket.gethostname()))
        reply = client.request(channel, Control.HELLO + body)
    except ConnectionLostError as exc:
        # refused (it runs another fiber, protocol or Python: the reply says which):
        # one line for the job's log, which is what a user of the backend sees
        sys.stderr.write(f"fiber: this job stops: {exc}\n")
        return 1
    # heartbeat first: importing the main module below may take long
    # (without it the parent cannot tell this job alive: the job ends)
    threads.start("fiber-heartbeat", _heartbeat, client, channel, cfg.heartbeat_interval,
                  cfg.heartbeat_timeout, fails=threads.end_process)
    client.always_read = True  # (the heartbeat waits on it: a pool worker's give line)
    prep, payload = pickle.loads(reply)
    output = _Output(client, channel, {b"1": sys.stdout, b"2": sys.stderr})
    out, err = _Forwarder(output, b"1"), _Forwarder(output, b"2")
    sys.stdout, sys.stderr = out, err
    run.set_job(importing_main=True)
    try:
        _prepare(prep)
        process_obj = serialization.loads_code(payload)
    except BaseException:  # noqa: BLE001 - the parent raises it as ProcessStartError
        return _report_failure(client, channel, out, err)
    finally:
        run.set_job(importing_main=False)
    exitcode = process_obj._bootstrap()
    out.drain()
    err.drain()
    try:
        client.request(channel, Control.EXIT + pickle.dumps(exitcode), timeout=30)
    except ConnectionLostError:
        pass
    return exitcode


def _run() -> None:
    """``python -m fiber.runtime.bootstrap``: whatever happens, exit (no thread of the
    connection may keep the job alive)."""
    code = 1
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report, then exit like an interpreter would
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# what the local backend's template calls in a job it forks, instead of running this
# module's code again, and before each fork, with the job's environment and working
# directory: its settings, computed there once for all jobs alike
# (fiber.backend.local.forkserver)
FORKED_MAIN = _run


def _before_fork(env: dict[str, str], cwd: str) -> None:
    """``FORKED_PREPARE``: the job's settings; once, OpenSSL's HMAC made ready (a
    job's first HMAC, for its handshake, otherwise set up OpenSSL's digest state
    itself: some thirty pages) and the hello encoded but for the pid (the template's
    host is its jobs')."""
    global _hello
    config.prepare_for_child(env, cwd)
    if _hello is None:
        auth.answer(b"\0" * 32, b"", b"")
        _hello = protocol.hello_maker(socket.gethostname())


# a forked job's hello body, given its pid (made by _before_fork in the template)
_hello: Callable[[int], bytes] | None = None
FORKED_PREPARE = _before_fork

if __name__ == "__main__":
    _run()
