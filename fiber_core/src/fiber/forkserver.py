"""The local backend's template process: ``python -m fiber.forkserver SOCKET``.

Starting a job by forking this pre-imported interpreter costs a few milliseconds and
shares its memory copy-on-write, where starting a new interpreter costs ~100 ms of CPU
and ~30 MB per job: this is what makes pools of hundreds of local workers start in
about a second. The template is single-threaded and never opens an nng socket (nng is
not fork-safe); it serves one connection from its backend over a private Unix socket:

* ``("spawn", key, env, cwd, log_path)`` forks a child in a new session that runs
  :func:`fiber.bootstrap.main` with exactly ``env``, in ``cwd``, its output in
  ``log_path``; answers ``("spawned", key, pid)`` or ``("failed", key, message)``.
* When a child ends it sends ``("exited", pid, returncode)`` (negative signal number
  for a signal), as :class:`subprocess.Popen` would report it.

The template exits when its backend's connection closes.
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import struct
import sys
import traceback

import fiber.bootstrap  # noqa: F401 - pre-import what every job needs

_LEN = struct.Struct("<I")


def send_message(sock: socket.socket, message: object) -> None:
    data = pickle.dumps(message, 5)
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_message(sock: socket.socket, buffer: bytearray) -> list:
    """Read what is available; return the complete messages in ``buffer``."""
    chunk = sock.recv(1 << 16)
    if not chunk:
        raise EOFError
    buffer += chunk
    messages = []
    while len(buffer) >= _LEN.size:
        (size,) = _LEN.unpack_from(buffer)
        if len(buffer) < _LEN.size + size:
            break
        messages.append(pickle.loads(bytes(buffer[_LEN.size:_LEN.size + size])))
        del buffer[:_LEN.size + size]
    return messages


def _child(closables: list, pipe_fds: tuple[int, int], env: dict, cwd: str | None,
           log_path: str) -> None:
    """In the forked child: become the job."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for closable in closables:
            closable.close()
        for fd in pipe_fds:
            os.close(fd)
        import uuid

        from fiber import popen

        popen._PROCESS_UID = uuid.uuid4().hex[:8]  # each job is its own parent
        os.setsid()
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        from fiber import bootstrap

        code = bootstrap.main()
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


def serve(path: str) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    conn, _ = listener.accept()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ, "conn")
    selector.register(read_end, selectors.EVENT_READ, "chld")
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
                    send_message(conn, ("exited", pid, os.waitstatus_to_exitcode(status)))
                continue
            try:
                messages = recv_message(conn, buffer)
            except (EOFError, OSError):
                os._exit(0)  # the backend is gone; its jobs notice their parent is gone
            for _op, key_, env, cwd, log_path in messages:
                if cwd and not os.path.isdir(cwd):
                    send_message(conn, ("failed", key_, f"no such directory: {cwd}"))
                    continue
                pid = os.fork()
                if pid == 0:
                    _child([conn, listener, selector], (read_end, write_end), env, cwd,
                           log_path)
                send_message(conn, ("spawned", key_, pid))


if __name__ == "__main__":
    serve(sys.argv[1])
