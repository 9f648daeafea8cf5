"""The local backend's template process: ``python -m fiber.backend.local.forkserver FD``.

Starting a job by forking this pre-imported interpreter costs a few milliseconds and
shares its memory copy-on-write, where starting a new interpreter costs ~100 ms of CPU
and ~30 MB per job: this is what makes pools of hundreds of local workers start in
about a second. The template is single-threaded and never opens an nng socket (nng is
not fork-safe); it serves one connection from its backend: the Unix socket ``FD``, one
end of a socket pair the backend made (no file, nothing to wait for). Before serving
it also does, once, the work every job would repeat: loading the installed plugins
(their entry points) and importing the modules of fiber and of the standard library
that the parent has imported (fork-safe, no third-party state shared between jobs).
It does not run the parent's main module nor the other modules it imports (a job runs
them itself, as multiprocessing's spawn does), but it caches the compiled code of
those whose bytecode cache is missing or stale and of the main script (the job then
skips compiling an unchanged source file, as if a valid ``.pyc`` were there). Before each fork it freezes
its objects (``gc.freeze()``), so that a job's garbage collections do not write to
(and copy) the pages it shares with the template. The protocol:

* ``("preload", modules, sources)`` (first, see :mod:`fiber.backend.local.preload`): import the
  ``modules``, compile the files of the ``sources`` modules; no answer.
* ``("spawn", key, module, env, cwd, log_path)`` imports ``module`` here (once, and
  keeps its compiled code: a child does not compile it again), then forks a child in
  a new session that runs it as ``python -m module`` would, with
  exactly ``env``, in ``cwd``, its output in ``log_path``; answers
  ``("spawned", key, pid)`` or ``("failed", key, message)``.
* When a child ends it sends ``("exited", pid, returncode)`` (negative signal number
  for a signal), as :class:`subprocess.Popen` would report it.

The template exits when its backend's connection closes.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half (no stub): see _child
import gc
import os
import pickle
import runpy
import selectors
import signal
import socket
import struct
import sys
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from fiber.backend.local.preload import apply_preload, preload

if TYPE_CHECKING:  # for annotations only (importlib.abc is not imported at start-up)
    from importlib.machinery import ModuleSpec

_LEN = struct.Struct("<I")
# the signals the template handles or ignores, which a job has at their defaults
_DEFAULT_SIGNALS = (int(signal.SIGCHLD), int(signal.SIGTERM), int(signal.SIGINT))


def send_message(sock: socket.socket, message: object) -> None:
    data = pickle.dumps(message, 5)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_message(sock: socket.socket, buffer: bytearray) -> list[Any]:
    """Read what is available; return the complete messages in ``buffer``."""
    chunk = sock.recv(1 << 16)
    if not chunk:
        raise EOFError
    buffer += chunk
    messages: list[Any] = []
    while len(buffer) >= _LEN.size:
        (size,) = _LEN.unpack_from(buffer)
        if len(buffer) < _LEN.size + size:
            break
        messages.append(pickle.loads(bytes(buffer[_LEN.size:_LEN.size + size])))
        del buffer[:_LEN.size + size]
    return messages


def _child(own_fds: Sequence[int], module: str, env_changes: _EnvChanges,
           cwd: str | None, log_path: str) -> NoReturn:
    """In the forked child: become the job."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        # the C functions: signal.signal's wrapper makes an enum of the old handler,
        # whose machinery touches (and copies) dozens of the template's pages
        for signum in _DEFAULT_SIGNALS:
            _signal.signal(signum, _signal.SIG_DFL)
        # the template's descriptors, closed by number: closing its socket and
        # selector objects ran their Python close methods, which touched (and
        # copied) some of the template's pages. Those objects still name the numbers,
        # but are never closed or collected here (the serving frame holds them, and
        # the child ends by os._exit), so a descriptor the job reopens under one of
        # these numbers is never closed behind its back
        for fd in own_fds:
            os.close(fd)
        os.setsid()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        _change_environment(*env_changes)
        if cwd:
            os.chdir(cwd)
        entry = _entries.get(module)
        if entry is None or not _streams_on_1_and_2:
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
        # (else the template's own streams, on file descriptors 1 and 2, which are the
        # job's log now: making two new ones copied some eighty pages; fiber's
        # bootstrap replaces them as it starts, writing to them only on failures)
        sys.argv = [module]
        if entry is not None:
            _run_entry(module, entry)
        _forget(module)
        job = _job_code.get(module)
        if job is None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            _run_as_main(*job)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - report, then exit like an interpreter would
        try:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            code = 1
    finally:
        os._exit(code)


def _run_entry(module: str, entry: Callable[[], object]) -> None:
    """In the child: run a job module that names its entry point (``FORKED_MAIN``,
    see :func:`_import_once`) by calling it in the template's imported module, which
    becomes ``__main__`` (what ``python -m`` would run, without executing the module's
    code again: that made its functions and classes anew, touching and so copying
    about a hundred of the template's pages). ``__main__`` is a copy of the module's
    namespace named ``__main__``, as runpy makes it: named as the module, a function
    of the program's main script rebound to it in a job that cannot read that script
    (see :func:`fiber.wire.serialization.rebind_main`) had its traceback's lines read from the
    module's own source by its loader (``linecache.lazycache``)."""
    imported = sys.modules[module]
    main = types.ModuleType("__main__")
    main.__dict__.update(vars(imported))
    main.__name__ = "__main__"
    sys.modules["__main__"] = main
    path = getattr(main, "__file__", None)
    if path:
        sys.argv[0] = path
    entry()


_EnvChanges = tuple[list[str], list[tuple[str, str]]]


def _environment_changes(env: Mapping[str, str]) -> _EnvChanges:
    """Before a fork: what makes this process's environment exactly ``env``, the
    variables to remove and those to set (a job's environment is mostly the
    template's: clearing and refilling it touched every variable, and comparing them
    all in the child still read about forty pages' worth of them)."""
    current = os.environ
    removed = [name for name in current if name not in env]
    changed = [(name, value) for name, value in env.items() if current.get(name) != value]
    return removed, changed


def _change_environment(removed: list[str], changed: list[tuple[str, str]]) -> None:
    """In the child: apply :func:`_environment_changes`."""
    current = os.environ
    for name in removed:
        del current[name]
    for name, value in changed:
        current[name] = value


def _forget(module: str) -> None:
    """Take ``module`` (imported by the template: :func:`_import_once`) out of
    ``sys.modules`` and its package, so that the child runs it as ``python -m module``
    would: as ``__main__`` only. runpy warns when the module it runs is imported
    already (``RuntimeWarning: ... found in sys.modules after import of package ...``,
    into every job's log) and would leave two copies of it. What the module imported
    stays imported: that is the saving."""
    sys.modules.pop(module, None)
    parent, _, name = module.rpartition(".")
    package = sys.modules.get(parent) if parent else None
    if package is not None and name in vars(package):
        delattr(package, name)


# a job module's spec and compiled code, found once here (see :func:`_import_once`)
_job_code: dict[str, tuple[ModuleSpec, types.CodeType]] = {}
# a job module's entry point and its preparation before a fork, when it names them
# (see :func:`_import_once`)
_entries: dict[str, Callable[[], object]] = {}
_prepares: dict[str, Callable[[Mapping[str, str], str], object]] = {}


def _import_once(module: str) -> None:
    """Import a job's module before forking, for the modules it imports (the child
    runs the module itself afresh: :func:`_forget`), and keep its spec and compiled
    code, so that a child neither searches for the module nor compiles it (without a
    bytecode cache, e.g. under ``PYTHONDONTWRITEBYTECODE``, that compile was most of a
    job's CPU before its first task); a failure is the job's to report. A module
    that names the function its ``if __name__ == "__main__":`` block calls, in a
    global ``FORKED_MAIN`` (fiber's bootstrap does), is not run again: the child calls
    that function of the module imported here (:func:`_run_entry`). One that names
    in ``FORKED_PREPARE`` a function of ``(env, cwd)`` has it called here before each
    fork with the job's environment and working directory, to do for the child what
    does not depend on the child itself (fiber's bootstrap computes the job's
    settings: :func:`fiber.runtime.config.prepare_for_child`)."""
    if module in _job_code or module in _entries:
        return
    import importlib
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        # a package (``-m`` runs its __main__) or a loader without code: runpy's way
        if spec is not None and spec.submodule_search_locations is None and spec.loader:
            code = spec.loader.get_code(module)  # type: ignore[attr-defined]  # a SourceLoader's (None from others: runpy's way)
            if code is not None:
                _job_code[module] = (spec, code)
        if module not in sys.modules:
            importlib.import_module(module)
        entry = getattr(sys.modules[module], "FORKED_MAIN", None)
        if callable(entry):
            _entries[module] = entry
        prepare = getattr(sys.modules[module], "FORKED_PREPARE", None)
        if callable(prepare):
            _prepares[module] = prepare
    except Exception:  # noqa: BLE001 - the job imports it again and reports it
        pass


def _run_as_main(spec: ModuleSpec, code: types.CodeType) -> None:
    """In the child: run a job module's code as ``python -m`` runs a module, as
    ``__main__`` with the globals runpy gives it and ``sys.argv[0]`` its file."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=spec.origin, __cached__=spec.cached, __doc__=None,
                         __loader__=spec.loader, __package__=spec.parent, __spec__=spec)
    sys.modules["__main__"] = main
    if spec.origin:
        sys.argv[0] = spec.origin
    exec(code, main.__dict__)


def _prepare(module: str, env: Mapping[str, str], cwd: str | None) -> None:
    """Call the job module's ``FORKED_PREPARE(env, cwd)``, when it names one (see
    :func:`_import_once`), here before the fork; a failure is the job's to report
    (it does that work itself)."""
    prepare = _prepares.get(module)
    if prepare is not None:
        try:
            prepare(env, cwd or os.getcwd())
        except Exception:  # noqa: BLE001 - the job does it itself
            pass


def _tell(conn: socket.socket, message: tuple[object, ...]) -> None:
    """Send ``message`` to the backend; when it is gone (its process ended, killed or
    not), the template ends quietly, as when a read finds it gone: nothing is left to
    tell, and its jobs notice their parent is gone."""
    try:
        send_message(conn, message)
    except OSError:
        os._exit(0)


def _on_fd(stream: object, fd: int) -> bool:
    try:
        return stream is not None and stream.fileno() == fd  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False


# whether this process's sys.stdout and sys.stderr write to file descriptors 1 and 2
# (a job of a module with an entry point keeps them: see _child)
_streams_on_1_and_2 = False


def serve(fd: int) -> None:
    global _streams_on_1_and_2
    conn = socket.socket(fileno=fd)
    _streams_on_1_and_2 = _on_fd(sys.stdout, 1) and _on_fd(sys.stderr, 2)
    preload()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ, "conn")
    selector.register(read_end, selectors.EVENT_READ, "chld")
    # what a child closes (an epoll or kqueue selector has a descriptor; select's none)
    own_fds = [conn.fileno(), read_end, write_end]
    selector_fd = getattr(selector, "fileno", None)
    if selector_fd is not None:
        own_fds.append(selector_fd())
    buffer = bytearray()
    while True:
        for key, _ in selector.select():
            if key.data == "chld":
                os.read(read_end, 4096)
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    _tell(conn, ("exited", pid, os.waitstatus_to_exitcode(status)))
                continue
            try:
                messages = recv_message(conn, buffer)
            except (EOFError, OSError):
                os._exit(0)  # the backend is gone; its jobs notice their parent is gone
            for op, *args in messages:
                if op == "preload":
                    apply_preload(*args)
                    continue
                key_, module, env, cwd, log_path = args
                if cwd and not os.path.isdir(cwd):
                    _tell(conn, ("failed", key_, f"no such directory: {cwd}"))
                    continue
                _import_once(module)
                _prepare(module, env, cwd)
                changes = _environment_changes(env)
                gc.freeze()  # the objects so far are never collected in a child
                pid = os.fork()
                if pid == 0:
                    _child(own_fds, module, changes, cwd, log_path)
                _tell(conn, ("spawned", key_, pid))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
