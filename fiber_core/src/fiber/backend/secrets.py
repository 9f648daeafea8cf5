"""How a job gets the run's secret without anyone else seeing it: the part of the
backend contract about :attr:`JobSpec.secrets <fiber.backend.JobSpec>`.

The core gives every job the run's secret (``_FIBER_AUTHKEY``, hex) in
``JobSpec.secrets``, a ``{name: value}`` mapping kept apart from ``JobSpec.env``. In the
job, each entry must become an environment variable of the job's process, as an
``env`` entry would, but the value must never appear where the cluster shows or keeps
a job's description: a command line, a pod spec, ``docker inspect``, a scheduler's
stored environment or batch script. A backend says how it does that with
:attr:`Backend.secrets_delivery <fiber.backend.Backend.secrets_delivery>`:

``"private"``
    ``create_job`` delivers ``spec.secrets`` itself, through the engine's secret
    mechanism (a Kubernetes Secret referenced by the pod) or a private channel: the
    job's standard input read by a wrapper that exports them (SSH), or **a secrets
    file**, the one job-side mechanism every backend may use: write the file with
    :func:`write_secrets_file` (mode 0600, readable only by the job's user; one
    ``NAME=VALUE`` line per secret) where only the job can read it, and put its path in
    the job's environment as ``_FIBER_SECRETS_FILE`` (:data:`SECRETS_FILE_ENV`). The
    job's bootstrap reads the file into its environment (:func:`load_secrets`) and
    removes it when it can; the backend removes it with the job in any case
    (:meth:`Backend.release`), and when ``create_job`` fails.
``"env"``
    The backend has no private channel, and declares that a job's environment on its
    cluster is readable only by the job's user and root (a local subprocess, whose
    ``/proc/<pid>/environ`` is as private as a 0600 file): the core then merges
    ``spec.secrets`` into ``spec.env`` before calling ``create_job``, which gets an
    empty ``secrets``. Only a backend whose jobs' environments are not stored nor
    shown by the cluster may say so.
``None`` (the default)
    The backend does not deliver secrets: the core refuses to start fiber processes on
    it (:class:`~fiber.backend.JobCreationError`), rather than leak the secret into an
    environment it cannot vouch for.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import replace
from typing import TYPE_CHECKING

from fiber.errors import JobCreationError, documented

if TYPE_CHECKING:
    from fiber.backend.base import Backend
    from fiber.backend.job import JobSpec

__all__ = ["DELIVERIES", "SECRETS_FILE_ENV", "SecretsFileError", "for_backend",
           "load_secrets", "read_secrets_file", "secrets_file_content", "write_secrets_file"]

#: the job's environment variable that names its secrets file
SECRETS_FILE_ENV = "_FIBER_SECRETS_FILE"
#: the values of :attr:`Backend.secrets_delivery` that deliver secrets
DELIVERIES = ("private", "env")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@documented
class SecretsFileError(OSError):
    """A job's secrets file cannot be read (missing, unreadable, malformed)."""


def _check(name: str, value: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"secret name {name!r} is not a valid environment variable name")
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"secret {name} contains a line break or a NUL character")


def secrets_file_content(secrets: Mapping[str, str]) -> bytes:
    """The bytes of a secrets file: one ``NAME=VALUE`` line per secret (UTF-8).
    Raises ``ValueError`` for a name that is no environment variable name or a value
    with a line break."""
    lines = []
    for name, value in secrets.items():
        _check(name, str(value))
        lines.append(f"{name}={value}\n")
    return "".join(lines).encode("utf-8")


def write_secrets_file(path: str, secrets: Mapping[str, str]) -> None:
    """Create ``path`` (it must not exist; not through a symbolic link) with mode
    0600, readable only by this user, holding ``secrets``."""
    data = secrets_file_content(secrets)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def read_secrets_file(path: str) -> dict[str, str]:
    """The secrets in the file ``path`` (written by :func:`write_secrets_file`)."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretsFileError(errno.EIO, f"cannot read the job's secrets file {path} "
                               f"({SECRETS_FILE_ENV}): {exc}") from None
    secrets = {}
    for number, line in enumerate(text.splitlines(), 1):
        name, sep, value = line.partition("=")
        if not sep or not _NAME.match(name):
            raise SecretsFileError(errno.EINVAL, f"line {number} of the job's secrets file "
                                   f"{path} is not NAME=VALUE")
        secrets[name] = value
    return secrets


def load_secrets(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """The job's side: when the environment names a secrets file
    (:data:`SECRETS_FILE_ENV`), put its secrets into the environment (the process's
    own: what its children inherit, readable by its user and root only; the
    cluster's records never see it), remove that variable, and remove the file when
    possible (a read-only mount keeps it: its backend removes it with the job).
    Returns the names loaded. Raises :class:`SecretsFileError` when the file cannot
    be read: the job cannot join its run then."""
    env = os.environ if environ is None else environ
    path = env.get(SECRETS_FILE_ENV)
    if not path:
        return []
    secrets = read_secrets_file(path)
    env.update(secrets)
    del env[SECRETS_FILE_ENV]
    try:
        os.unlink(path)
    except OSError:
        pass  # not ours to remove (read-only), or gone: the backend removes it
    return list(secrets)


def for_backend(backend: Backend, spec: JobSpec) -> JobSpec:
    """(Used by the core.) ``spec`` as ``backend`` must receive it: unchanged for a
    backend that delivers secrets privately, with the secrets moved into ``env`` for
    one that declared its jobs' environments private; refused (JobCreationError)
    for a backend that does not deliver them."""
    if not spec.secrets:
        return spec
    delivery = getattr(backend, "secrets_delivery", None)
    if delivery == "private":
        return spec
    if delivery == "env":
        return replace(spec, env={**spec.env, **spec.secrets}, secrets={})
    raise JobCreationError(
        f"the {backend.name} backend does not say how it delivers the run's secret to its "
        "jobs (its secrets_delivery is "
        f"{delivery!r}, not one of {', '.join(map(repr, DELIVERIES))}), so fiber does not "
        "start jobs on it: putting the secret in the job's environment could show it to "
        "whoever can read the cluster's job descriptions. The backend's author must "
        "deliver JobSpec.secrets (see fiber.backend.secrets)")
