"""The local backend's side of its template process
(:mod:`fiber.backend.local.forkserver`, the template's own side): :class:`ForkServer`
starts one template and asks it to fork jobs, reading its answers and its jobs' ends in
a thread; :class:`ForkedChild` is such a job, with the parts of Popen's interface the
backend uses. A template that exits fails the spawns waiting for it
(:class:`TemplateExited`: the backend then starts a new one) and ends the jobs forked
from it.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

from fiber import threads
from fiber.backend import JobCreationError, TransientBackendError

__all__ = ["SPAWN_HINT", "ForkServer", "ForkedChild", "TemplateExited"]

logger = logging.getLogger("fiber")


class ForkedChild:
    """A job forked by the template, with the parts of Popen's interface the backend
    uses (the template, not this process, is its parent and reports its end)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _set_exit(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            # (only a finite timeout can run out)
            raise subprocess.TimeoutExpired(f"job {self.pid}", timeout or 0.0)
        code = self.returncode
        assert code is not None  # set before _ended
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


SPAWN_HINT = "FIBER_LOCAL_START_METHOD=spawn to start jobs without it"


class TemplateExited(JobCreationError):
    """The template exited before it answered a spawn (a new one may)."""


class _Pending:
    """A spawn request waiting for the template's answer: the child, or the
    template's error message (``None`` when the template exited)."""

    __slots__ = ("done", "answer")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer: ForkedChild | str | None = None


class ForkServer:
    """The connection to one template process (see :mod:`fiber.backend.local.forkserver`)."""

    def __init__(self, job_modules: Sequence[str] = ()) -> None:
        from fiber.backend.local import forkserver, preload

        self._proto = forkserver
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", forkserver.__name__, str(theirs.fileno())],
                stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            self._sock.close()
            raise JobCreationError(
                f"cannot start the local backend's template process: {exc} (set "
                f"{SPAWN_HINT})") from exc
        finally:
            theirs.close()
        # what the template can do once for all jobs (see its module)
        names, sources = preload.preload_plan()
        names.extend(preload.module_files(job_modules))
        sources.extend(preload.main_source())
        forkserver.send_message(self._sock, ("preload", names, sources))
        self.dead = False
        self._closing = False
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._waiting: dict[int, _Pending] = {}
        self._children: dict[int, ForkedChild] = {}
        self._abandoned: set[int] = set()  # spawns given up on before their answer
        self._reader_error: BaseException | None = None
        self._reader = threads.start("fiber-forkserver", self._read, fails=self._reader_died)

    def spawn(self, module: str, env: dict[str, str], cwd: str | None,
              log_path: str, timeout: float) -> ForkedChild:
        """Fork a job running ``module`` from the template; a transient error when the
        template has not answered within ``timeout`` seconds."""
        key = next(self._keys)
        slot = _Pending()
        with self._lock:
            if self.dead:
                raise self._gone_error()
            self._waiting[key] = slot
            try:
                self._proto.send_message(self._sock, ("spawn", key, module, env, cwd,
                                                      log_path))
            except OSError:
                self._waiting.pop(key, None)
                gone = self._gone_error()
                raise gone from gone.__cause__
        if not slot.done.wait(timeout):
            with self._lock:
                if self._waiting.pop(key, None) is not None:
                    self._abandoned.add(key)  # a late answer's child is ended
            if not slot.done.is_set():
                # frozen (SIGSTOP) or starved, not broken: the core asks again
                raise TransientBackendError(
                    f"the local backend's template process (pid {self._proc.pid}) has not "
                    f"answered for {timeout:g} s (if it stays stuck, set "
                    f"{SPAWN_HINT})")
        answer = slot.answer
        if isinstance(answer, str):
            raise JobCreationError(f"cannot start a local job: {answer}")
        if answer is None:
            raise self._gone_error()
        return answer

    def _gone_error(self) -> TemplateExited:
        """Why a spawn failed for want of the template: read when it fails, for the
        reader thread's death (recorded before the spawns waiting are woken) may come
        while the spawn runs."""
        error = self._reader_error
        if error is None:
            return TemplateExited("the local backend's template process has exited (see "
                                   f"its error above; set {SPAWN_HINT})")
        gone = TemplateExited(f"the local backend's template process is unusable: {error} "
                               f"(set {SPAWN_HINT})")
        gone.__cause__ = error
        return gone

    def _read(self) -> None:
        buffer = bytearray()
        try:
            while True:
                for message in self._proto.recv_message(self._sock, buffer):
                    self._dispatch(message)
        except (EOFError, OSError):
            pass
        self._gone()

    def _reader_died(self, error: BaseException) -> None:
        """The reader thread died: nobody reads the template's answers any more. End
        the template (the next job starts from a new one) as if it had exited."""
        self._reader_error = error
        self._closing = True  # (ended on purpose: no "exited" warning)
        self._gone()
        self.close()

    def _gone(self) -> None:
        """The template's stream ended: fail the spawns waiting for it, end its jobs."""
        with self._lock:
            self.dead = True
            waiting, self._waiting = self._waiting, {}
            children = [c for c in self._children.values() if c.returncode is None]
        if not self._closing:
            try:
                code: int | None = self._proc.wait(5)
            except subprocess.TimeoutExpired:
                code = None
            logger.warning("the local backend's template process (pid %d) exited with "
                           "code %s; ending the %d jobs forked from it, and starting the "
                           "next jobs from a new one", self._proc.pid, code, len(children))
        for slot in waiting.values():
            slot.done.set()
        for child in children:  # orphaned by the template: end them, call them killed
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            child._set_exit(-signal.SIGKILL)

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "exited":
            _, pid, code = message
            with self._lock:
                child = self._children.pop(pid, None)
            if child is not None:
                child._set_exit(code)
            return
        _, key, value = message
        answer: ForkedChild | str = value  # "failed": the template's error message
        with self._lock:
            slot = self._waiting.pop(key, None)
            if kind == "spawned" and key in self._abandoned:
                self._abandoned.discard(key)
                try:  # nobody waits for this child: end it (its end is reported)
                    os.killpg(value, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return
            self._abandoned.discard(key)
            if kind == "spawned":
                answer = ForkedChild(value)
                self._children[value] = answer
        if slot is not None:
            slot.answer = answer
            slot.done.set()

    def close(self) -> None:
        self._closing = True
        try:
            # shut down first: a plain close() does not end the reader thread's recv,
            # so the template would never see the end of the stream
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        finally:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
