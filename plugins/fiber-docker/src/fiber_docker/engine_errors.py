"""What a failed call to the Docker engine means: a fiber error, transient or not.

docker-py reports an engine it cannot talk to as ``requests`` exceptions (or, while it
asks the engine for its API version, a ``DockerException`` caused by one), with the
operating system's error buried in their arguments. :func:`classify` digs it out and
decides, as an administrator would read it (docs/backend-errors.md):

- the socket file does not exist (``ENOENT``) before this backend ever reached the
  engine: no engine is there, a setting to fix, **permanent** at once with the hint.
  Once the engine was reached, a missing socket is a daemon that restarts (dockerd
  removes its socket when it stops): **transient**;
- permission denied (``EACCES``/``EPERM``) on the socket: **permanent**, with the hint
  (the docker group, or a socket this user may use);
- connection refused (a socket file with no daemon behind it), reset, and time-outs
  (a daemon that is frozen, overloaded, starting): **transient**.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator

import requests

from fiber.backend import ClusterUnreachableError

_PERMISSION = {errno.EACCES, errno.EPERM}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception in its causes, contexts and arguments."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [a for a in current.args if isinstance(a, BaseException)]
        for linked in (current.__cause__, current.__context__,
                       getattr(current, "reason", None)):
            if isinstance(linked, BaseException):
                todo.append(linked)


def os_errno(exc: BaseException) -> int | None:
    """The errno of the operating system's error under ``exc``, if there is one."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno:
            return int(item.errno)
    return None


def timed_out(exc: BaseException) -> bool:
    return any(isinstance(item, (requests.exceptions.Timeout, TimeoutError))
               for item in _chain(exc))


def classify(exc: BaseException, address: str, what: str, reached: bool,
             hint: str, timeout: float) -> ClusterUnreachableError:
    """The fiber error for ``exc``, raised by an engine call that tried to ``what``
    (an action, "create a container") at ``address``; ``reached`` says whether this
    backend has talked to the engine before, ``hint`` how to start or point at one,
    ``timeout`` the client's time-out (setting ``docker_timeout``)."""
    number = os_errno(exc)
    head = f"cannot reach the Docker engine at {address} to {what}"
    if number in _PERMISSION:
        return ClusterUnreachableError(
            f"{head}: permission denied on its socket ({exc}); this user may not use that "
            "engine: add the user to the engine's group (`sudo usermod -aG docker $USER`, "
            "then log in again), or point the docker_host setting (FIBER_DOCKER_HOST) or "
            "DOCKER_HOST at an engine this user may use (e.g. rootless Docker's socket)",
            transient=False)
    if number == errno.ENOENT and not reached:
        socket_path = address.removeprefix("unix://")
        return ClusterUnreachableError(
            f"{head}: no Docker engine is there (the socket {socket_path} does not exist); "
            + hint, transient=False)
    if timed_out(exc):
        return ClusterUnreachableError(
            f"{head}: the engine did not answer within {timeout:g} s (setting "
            f"docker_timeout) ({exc}); it may be overloaded, frozen or starting")
    if number == errno.ENOENT:
        return ClusterUnreachableError(
            f"{head}: its socket is gone (the daemon is restarting or stopped); " + hint)
    return ClusterUnreachableError(f"{head}: {exc}; " + hint)
