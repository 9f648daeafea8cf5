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

from fiber import threads, util
from fiber.backend.secrets import SecretsFileError, load_secrets
from fiber.errors import ConnectionLostError, FiberThreadError
from fiber.runtime import config, parent_link, run
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


class _Forwarder(io.TextIOBase):
    """A text stream whose lines go to the parent's stdout or stderr, in order, sent
    by a background thread in batches."""

    def __init__(self, client: transport.StreamClient, channel: int, stream: bytes,
                 original) -> None:
        self._ctx = client.context()
        self._channel = channel
        self._stream = stream
        self._original = original
        self._pending: list[str] = []
        self._partial = ""
        self._cond = threading.Condition()
        self._sending = False
        self._error: FiberThreadError | None = None  # the thread died: writes raise it
        self._thread = threads.start("fiber-output", self._run, fails=self._died,
                                     name=f"fiber-output-{stream.decode()}")

    def _died(self, error: FiberThreadError) -> None:
        with self._cond:
            self._error = error
            self._pending.clear()
            self._sending = False
            self._cond.notify_all()

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
        with self._cond:
            if self._error is not None:
                raise self._error
            data = self._partial + text
            cut = data.rfind("\n") + 1
            self._partial = data[cut:]
            if cut:
                self._pending.append(data[:cut])
                self._cond.notify()
        return len(text)

    def flush(self) -> None:
        with self._cond:
            if self._partial:
                self._pending.append(self._partial)
                self._partial = ""
                self._cond.notify()

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the whole lines written so far have reached the parent (what
        this process sends next, e.g. a manager's reply, then comes after them)."""
        with self._cond:
            if self._pending or self._sending:
                self._cond.wait_for(lambda: not self._pending and not self._sending,
                                    timeout)

    def drain(self, timeout: float = 10.0) -> None:
        """Flush, then wait until everything written has reached the parent."""
        self.flush()
        with self._cond:
            self._cond.wait_for(lambda: not self._pending and not self._sending, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                chunk = "".join(self._pending)
                self._pending.clear()
                self._sending = True
            try:
                self._ctx.request(self._channel,
                                  Control.OUTPUT + self._stream + chunk.encode("utf-8", "replace"))
            except Exception:  # noqa: BLE001 - the parent is gone; keep it in the logs
                try:
                    self._original.write(chunk)
                    self._original.flush()
                except (OSError, ValueError):
                    pass
            with self._cond:
                self._sending = False
                self._cond.notify_all()


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
        reply = client.request(channel, Control.HELLO
                               + protocol.hello(os.getpid(), socket.gethostname()))
    except ConnectionLostError as exc:
        # refused (it runs another fiber, protocol or Python: the reply says which):
        # one line for the job's log, which is what a user of the backend sees
        sys.stderr.write(f"fiber: this job stops: {exc}\n")
        return 1
    # heartbeat first: importing the main module below may take long
    # (without it the parent cannot tell this job alive: the job ends)
    threads.start("fiber-heartbeat", _heartbeat, client, channel, cfg.heartbeat_interval,
                  cfg.heartbeat_timeout, fails=threads.end_process)
    prep, payload = pickle.loads(reply)
    out = _Forwarder(client, channel, b"1", sys.stdout)
    err = _Forwarder(client, channel, b"2", sys.stderr)
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


if __name__ == "__main__":
    _run()
