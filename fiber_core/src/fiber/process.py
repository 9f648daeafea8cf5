"""Job-backed processes: ``fiber.Process`` and the functions around it, mirroring
:mod:`multiprocessing.process`.

``Process.start()`` asks the selected backend to create a job running
``python -m fiber.runtime.bootstrap``; the bootstrap dials back to this process's hub,
authenticates, receives the pickled Process object and runs it (see
:mod:`fiber.runtime.bootstrap` and :mod:`fiber.runtime.popen`). Differences from multiprocessing are
listed in docs/architecture.md.
"""

from __future__ import annotations

import collections
import functools
import itertools
import os
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fiber import util
from fiber.backend import Job, Resources
from fiber.runtime import run
from fiber.wire import auth
from fiber.wire.serialization import rebind_main

if TYPE_CHECKING:  # imported when a process starts (start-up time)
    from fiber.runtime.popen import JobPopen

__all__ = ["BaseProcess", "Process", "current_process", "parent_process", "active_children"]

_children: set[Process] = set()
#: children whose job ended and that _cleanup has not looked at yet, weakly: a child
#: that was joined or closed is in no list of this module, and a closed one that the
#: program no longer refers to is freed at once, as multiprocessing's
_ended_children: collections.deque[weakref.ref[Process]] = collections.deque()
#: seconds the exit waits for daemonic children, before and after forcing their end
DAEMON_JOIN_WAIT = 5.0
_counter = itertools.count(1)
_lock = threading.Lock()


class Process:
    """A process that runs as a job on the selected backend.

    Same constructor, attributes and methods as :class:`multiprocessing.Process`.
    """

    _start_method = None
    #: the context this class's processes are of (``ctx.Process`` sets it, as
    #: multiprocessing's context Process classes carry their start method); None: the
    #: default context, as for ``fiber.Process`` and the user's subclasses of it
    _ctx: Any = None

    def __init__(self, group: None = None, target: Callable[..., object] | None = None,
                 name: str | None = None, args: Iterable[Any] = (),
                 kwargs: Mapping[str, Any] | None = None, *,
                 daemon: bool | None = None,
                 resources: Resources | Mapping[str, Any] | None = None) -> None:
        assert group is None, "group argument must be None for now"
        # fiber extension: this process's resource request (on top of @fiber.meta's
        # and the settings'), checked by the backend at start()
        self._resources = None if resources is None else Resources.of(resources)
        count = next(_counter)
        parent = _current_process
        self._identity: tuple[int, ...] = parent._identity + (count,)
        self._config: dict[str, Any] = parent._config.copy()
        self._parent_pid: int | None = os.getpid()
        self._parent_name = parent.name
        self._popen: JobPopen | None = None
        self._closed = False
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._name = name or type(self).__name__ + "-" + ":".join(map(str, self._identity))
        if daemon is not None:
            self.daemon = daemon
        _dangling.add(self)

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    def run(self) -> None:
        """Method to be run in the job; override it in a subclass."""
        if self._target:
            rebind_main(self._target)(*self._args, **self._kwargs)

    def start(self) -> None:
        """Create the job that runs this process's :meth:`run`. Raises RuntimeError
        in a job that is still importing its parent's main module."""
        self._check_closed()
        assert self._popen is None, "cannot start a process twice"
        assert self._parent_pid == os.getpid(), \
            "can only start a process object created by current process"
        assert not _current_process._config.get("daemon"), \
            "daemonic processes are not allowed to have children"
        run.check_not_importing_main()
        _cleanup()
        util.flush_std_streams()  # what was printed before start() shows before the child's
        from fiber.runtime.popen import JobPopen  # here for start-up time, as above

        # its job goes where its context's target says (run.of: None is the default's)
        self._popen = JobPopen(self, run.of(self._ctx))
        with _lock:
            _children.add(self)
        # its end queues it for the next _cleanup (which then looks at no live child)
        self._popen.add_done_callback(
            functools.partial(_ended_children.append, weakref.ref(self)))
        util.at_exit("children", util.CHILDREN, _main_exit)
        del self._target, self._args, self._kwargs

    def terminate(self) -> None:
        """End the job (SIGTERM-like)."""
        self._check_closed()
        if self._popen is not None:
            self._popen.terminate()

    def kill(self) -> None:
        """End the job (SIGKILL-like)."""
        self._check_closed()
        if self._popen is not None:
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process ends. Raises :class:`fiber.ProcessStartError` when
        its job ended without ever running the process (a difference from
        multiprocessing, whose processes cannot fail that way)."""
        self._check_closed()
        assert self._parent_pid == os.getpid(), "can only join a child process"
        assert self._popen is not None, "can only join a started process"
        res = self._popen.wait(timeout)
        if res is not None:
            with _lock:
                _children.discard(self)
            self._popen.raise_start_error()

    def is_alive(self) -> bool:
        self._check_closed()
        if self is _current_process:
            return True
        assert self._parent_pid == os.getpid(), "can only test a child process"
        if self._popen is None:
            return False
        if self._popen.poll() is None:
            return True
        with _lock:
            _children.discard(self)
        return False

    def close(self) -> None:
        """Release the process object's resources (the job must have ended)."""
        if self._popen is not None:
            if self._popen.poll() is None:
                raise ValueError("Cannot close a process while it is still running. "
                                 "You should first call join() or terminate().")
            self._popen.close()
            self._popen = None
            with _lock:
                _children.discard(self)
        self._closed = True

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        assert isinstance(name, str), "name must be a string"
        self._name = name

    @property
    def daemon(self) -> bool:
        return self._config.get("daemon", False)

    @daemon.setter
    def daemon(self, daemonic: bool) -> None:
        assert self._popen is None, "process has already started"
        self._config["daemon"] = daemonic

    @property
    def authkey(self) -> bytes:
        return auth.get_authkey()

    @authkey.setter
    def authkey(self, authkey: bytes) -> None:
        auth.set_authkey(authkey)

    @property
    def exitcode(self) -> int | None:
        """None while running; the exit status, or the negative signal number."""
        self._check_closed()
        if self._popen is None:
            return None
        return self._popen.poll()

    @property
    def ident(self) -> int | None:
        """The process id on the host it runs on (see also :attr:`job_id`). As in
        multiprocessing, a started process has one; a job whose backend does not name
        it by its pid (a container, a pod) tells it when it runs, so this waits until
        then (None if it ended without running)."""
        self._check_closed()
        if self is _current_process:
            return os.getpid()
        if self._popen is None:
            return None
        wait_for_pid = getattr(self._popen, "wait_for_pid", None)
        return wait_for_pid() if wait_for_pid is not None else self._popen.pid

    pid = ident

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends, usable
        with :func:`multiprocessing.connection.wait` and :mod:`select`."""
        self._check_closed()
        if self._popen is None:
            raise ValueError("process not started")
        return self._popen.sentinel

    @property
    def job_id(self) -> str | None:
        """fiber extension: the backend's id of the job (container id, pod name...)."""
        return self._popen.job.id if self._popen is not None else None

    @property
    def job(self) -> Job | None:
        """fiber extension: the backend's :class:`fiber.backend.Job` this process runs
        as (its id, host, the spec it was made from), None before :meth:`start` and
        until the backend has created it. For tests and tools that look at the job."""
        return getattr(self._popen, "job", None) if self._popen is not None else None

    @property
    def host(self) -> str | None:
        """fiber extension: the host the job runs on, when known."""
        return self._popen.host if self._popen is not None else None

    def __repr__(self) -> str:
        exitcode = None
        if self is _current_process:
            status = "started"
        elif self._closed:
            status = "closed"
        elif self._parent_pid != os.getpid():
            status = "unknown"
        elif self._popen is None:
            status = "initial"
        else:
            exitcode = self._popen.poll()
            status = "started" if exitcode is None else "stopped"
        info = [type(self).__name__, f"name={self._name!r}"]
        if self._popen is not None and self._popen.job is not None:
            info.append(f"job={self._popen.job.id}")
        info.append(status)
        if exitcode is not None:
            info.append(f"exitcode={_exitcode_text(exitcode)}")
        if self.daemon:
            info.append("daemon")
        return "<{}>".format(" ".join(info))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_popen"] = None
        return state

    # -- in the job -----------------------------------------------------------------
    def _bootstrap(self) -> int:
        """Run the process in its job; returns the exit code (mirrors
        ``multiprocessing.process.BaseProcess._bootstrap``)."""
        global _current_process, _parent_process
        import traceback

        try:
            _children.clear()
            _ended_children.clear()
            _parent_process = _ParentProcess(self._parent_name, self._parent_pid)
            _current_process = self
            threading.main_thread()._name = "MainThread"  # type: ignore[attr-defined]  # not the setter: it may rename the OS thread too
            try:
                self.run()
                exitcode = 0
            finally:
                # the exit path of a job (which leaves by os._exit, without atexit):
                # children joined, then its queues' unread items, its shared objects
                # and segments released, in fiber.util's order; its connections stay
                # open for the last report to its parent
                _exit_function()
                util.run_exit_callbacks(down_to=util.CONNECTIONS)
        except SystemExit as exc:
            if exc.code is None:
                exitcode = 0
            elif isinstance(exc.code, int):
                exitcode = exc.code
            else:
                sys.stderr.write(str(exc.code) + "\n")
                exitcode = 1
        except BaseException:  # noqa: BLE001 - reported like multiprocessing does
            exitcode = 1
            sys.stderr.write(f"Process {self.name}:\n")
            traceback.print_exc()
        finally:
            _wait_for_threads()
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
        return exitcode


def _wait_for_threads() -> None:
    """Wait for the non-daemon threads the process left running, as a child of
    multiprocessing does before it exits (its interpreter's shutdown joins them): what
    they put in a queue or set on an Event then happens. Then the exit steps once more
    for what those threads made (children they started joined, queues they put in
    flushed): the job leaves by ``os._exit``, which waits for nothing."""
    me = threading.current_thread()
    waited = False
    while True:
        left = [t for t in threading.enumerate()
                if t is not me and not t.daemon and t.is_alive()]
        if not left:
            break
        waited = True
        for thread in left:  # as long as they run, as multiprocessing does
            thread.join()
    if waited:
        _exit_function()
        util.run_exit_callbacks(down_to=util.CONNECTIONS)


# multiprocessing.process.BaseProcess is the base of every start method's Process;
# fiber has one Process class (the contexts' SpawnProcess and others subclass it)
BaseProcess = Process


def _exitcode_text(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return str(code)


class _MainProcess(Process):
    def __init__(self) -> None:
        self._identity = ()
        self._name = "MainProcess"
        self._parent_pid = None
        self._popen = None
        self._closed = False
        self._config = {}

    def close(self) -> None:
        pass


class _ParentProcess:
    """What :func:`parent_process` returns in a child: name and pid of the parent (a
    process on another host cannot be joined or polled from here: its ``sentinel``,
    ``is_alive()`` and ``join()`` follow the job's connection to it,
    :mod:`fiber.runtime.parent_link`)."""

    def __init__(self, name: str, pid: int | None) -> None:
        self.name = name
        self.pid = self.ident = pid

    @property
    def sentinel(self) -> int:
        from fiber.runtime import parent_link

        return parent_link.sentinel()

    @property
    def exitcode(self) -> None:
        return None  # as multiprocessing's: a child cannot learn its parent's

    def is_alive(self) -> bool:
        from fiber.runtime import parent_link

        return parent_link.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the parent is gone (at most ``timeout`` seconds)."""
        from multiprocessing.connection import wait

        wait([self.sentinel], timeout)

    def __repr__(self) -> str:
        return f"<ParentProcess name={self.name!r} pid={self.pid}>"


_main_process = _MainProcess()
_current_process: Process = _main_process
_parent_process: _ParentProcess | None = None
_dangling: weakref.WeakSet[Process] = weakref.WeakSet()


def current_process() -> Process:
    """The Process object of the calling process."""
    return _current_process


def parent_process() -> _ParentProcess | None:
    """The parent of the calling process, or None in the main process."""
    return _parent_process


def _cleanup() -> None:
    """Forget the children whose end was signalled since the last call (each start
    calls this: at thousands of children, polling every one made starting quadratic,
    issue #29). A child's job calls back when it ends (JobPopen.add_done_callback)."""
    while _ended_children:
        try:
            p = _ended_children.popleft()()
        except IndexError:  # another thread took the last one
            return
        if p is None:
            continue  # closed and freed: it left _children when it was closed
        if p._popen is None or p._popen.poll() is not None:
            with _lock:
                _children.discard(p)


def active_children() -> list[Process]:
    """The live children of this process (joining the finished ones)."""
    _cleanup()
    with _lock:
        children = list(_children)
    # every one asked (a child whose end is being signalled right now is not listed)
    ended = [p for p in children if p._popen is not None and p._popen.poll() is not None]
    if ended:
        with _lock:
            _children.difference_update(ended)
    if not ended:
        return children
    gone = set(ended)
    return [p for p in children if p not in gone]


def _main_exit() -> None:
    """The main process's exit step for its children (see :mod:`fiber.util`)."""
    if _current_process is _main_process:
        _exit_function()


def _exit_function() -> None:
    """At the end of a process: terminate daemonic children, join the others (as
    multiprocessing does). Daemonic children are ended together (one call per
    backend) and waited for a bounded time: a cluster that does not answer cannot
    hold the exit (their jobs also leave on their own once this process is gone, and
    what the cluster could not end is said at exit)."""
    children = active_children()
    daemonic = [p for p in children if p.daemon]
    if daemonic:
        from fiber.runtime import teardown
        teardown.end_and_wait(daemonic, DAEMON_JOIN_WAIT)
    for p in active_children():
        if p.daemon:
            continue
        try:
            p.join()
        except Exception:  # noqa: BLE001 - joining at exit is best effort
            pass
    if "fiber.runtime.popen" in sys.modules:  # this process created jobs (else: nothing)
        from fiber.runtime import teardown
        teardown.release_all()  # ended jobs the cluster still keeps (containers, pods)

