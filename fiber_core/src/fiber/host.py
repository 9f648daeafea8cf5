"""Facts of this host that the records a process leaves for others rely on: when a
process started (:func:`start_time`: a pid and its start time name one process, so a
reused pid is not taken for it), and whether a directory is private to this user
(:func:`check_private`, and :func:`private_directory`, which warns once instead of
raising). The local backend's job records, the run records and the registrations
``fiber top`` reads are kept in such directories, named after such processes, each
written whole or not at all (:func:`write_record`) and read back alike
(:func:`read_records`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fiber.errors import NotPrivateError

__all__ = ["check_private", "private_directory", "start_time", "try_write_record", "write_record",
           "read_records"]

T = TypeVar("T")

logger = logging.getLogger("fiber")

_warned = False


def check_private(path: str, create: bool = True) -> str | None:
    """``path``, a directory private to this user (made with mode 0700 if ``create``);
    None when it does not exist (and ``create`` is false, or it cannot be made).
    Raises :class:`fiber.errors.NotPrivateError` when it exists but is not a
    directory of this user's that nobody else can read or write: then fiber must not
    use it (someone else could read a secret there, or plant what fiber acts on)."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            logger.debug("cannot create %s: %s", path, exc)
            return None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    why = None
    if not stat.S_ISDIR(info.st_mode):
        why = "it is not a directory" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode)
                                          else "")
    elif info.st_uid != os.getuid():
        why = f"it belongs to user id {info.st_uid}, not to this user ({os.getuid()})"
    elif info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        why = f"its mode {stat.S_IMODE(info.st_mode):04o} lets other users in"
    if why is not None:
        raise NotPrivateError(
            f"{path} is not a directory private to this user: {why}. fiber does not use "
            "it. Remove it if it is yours (or ask its owner or the administrator to), or "
            "set TMPDIR to a directory of your own")
    return path


def private_directory(path: str, create: bool) -> str | None:
    """``path`` as :func:`check_private` gives it, or None (with one warning per
    process) when it is not private: records name processes to signal, so nobody else
    may write them, and `fiber jobs` and `fiber clean` cannot see jobs then."""
    global _warned
    try:
        return check_private(path, create)
    except NotPrivateError as exc:
        if not _warned:
            _warned = True
            logger.warning("%s (fiber jobs and fiber clean cannot see this user's jobs "
                           "until then)", exc)
        return None


def start_time(pid: int) -> int | None:
    """When the process ``pid`` started (clock ticks since boot), or None when it does
    not exist or has ended (a zombie: only its parent's wait is left). On systems
    without ``/proc``: 0 for a process that exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    # fields[0] is the state (field 3 of proc(5)), fields[19] the start time (field 22)
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def write_record(path: str, data: Any) -> None:
    """Write ``data`` as JSON to ``path``, readable by this user only (0600), so that
    readers see the whole record or none: it is written next to ``path`` and renamed
    onto it. Raises OSError (what is written beside is left for the caller's sweep of
    its directory)."""
    partial = path + ".partial"
    # encoded whole by the C encoder (json.dump to a file runs the pure-Python one, a
    # third of a local job's record cost) and written by one call, no file object
    encoded = json.dumps(data).encode()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(encoded)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(partial, path)


def try_write_record(path: str, data: Any, what: str) -> bool:
    """:func:`write_record`, or False when it cannot be written (logged at debug as
    ``what``): a record is bookkeeping its writer goes on without."""
    try:
        write_record(path, data)
    except OSError as exc:
        logger.debug("cannot write %s %s: %s", what, path, exc)
        return False
    return True


def read_records(path: str, build: Callable[[str, dict[str, Any]], T],
                 kind: str) -> Iterator[T]:
    """The records of directory ``path`` (its ``*.json`` files, as :func:`write_record`
    writes them), each made by ``build(file, data)``, in the order of their names. A
    record removed meanwhile is passed over; one that cannot be read or built is
    passed over and logged (debug) as an unreadable ``kind``."""
    for entry in sorted(os.listdir(path)):
        if not entry.endswith(".json"):
            continue
        file = os.path.join(path, entry)
        try:
            with open(file) as f:
                data = json.load(f)
            made = build(file, data)
        except FileNotFoundError:
            continue  # removed meanwhile
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.debug("ignoring the unreadable %s %s: %s", kind, entry, exc)
            continue
        yield made
