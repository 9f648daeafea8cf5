"""The job's secrets file in its container: a tar archive the backend copies into the
created container (``put_archive``) before it starts, so that the run's secret is
neither in the container's configuration (``docker inspect``: Env, Cmd, Args, Labels)
nor in a file on the engine's machine.

The archive holds the directory ``/.fiber-secrets`` (mode 0700) and in it the file
``secrets`` (mode 0600, :func:`fiber.backend.secrets_file_content`), both owned by the
user the image runs as when it is numeric or unset (root); an image whose user is
named (``USER fiber``) gets the directory 0755 and the file 0644 instead, since its
uid is not known before the container runs: the container's filesystem is private to
the job's processes anyway (other users of the engine's machine cannot enter it).
The job's bootstrap removes the file once read (fiber.backend.load_secrets); the
container takes whatever is left with it.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Mapping

from fiber.backend import secrets_file_content

DIRECTORY = ".fiber-secrets"
#: the file's path in the container (its ``_FIBER_SECRETS_FILE``)
PATH = f"/{DIRECTORY}/secrets"


def owner(user: str) -> tuple[int, int] | None:
    """``(uid, gid)`` of an image's ``User`` (``""``, ``"uid"``, ``"uid:gid"``), or
    None when it is a name."""
    if not user:
        return 0, 0
    uid, _, gid = user.partition(":")
    if uid.isdigit() and (not gid or gid.isdigit()):
        return int(uid), int(gid) if gid else 0
    return None


def archive(secrets: Mapping[str, str], user: str) -> bytes:
    """The tar archive to extract at ``/`` of the job's container."""
    data = secrets_file_content(secrets)
    ids = owner(user)
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        directory = tarfile.TarInfo(DIRECTORY)
        directory.type = tarfile.DIRTYPE
        directory.mode = 0o700 if ids is not None else 0o755
        member = tarfile.TarInfo(PATH.lstrip("/"))
        member.size = len(data)
        member.mode = 0o600 if ids is not None else 0o644
        for info in (directory, member):
            info.mtime = now
            if ids is not None:
                info.uid, info.gid = ids
        tar.addfile(directory)
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()
