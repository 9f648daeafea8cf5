"""Which hosts the ssh backend may use: parsing ``ssh_hosts`` entries, the hosts file,
and ``~/.ssh/config`` aliases.

An entry is ``[user@]host[:port][*slots]``; ``host`` may be a name, an IPv4 address, a
bracketed IPv6 address (``[::1]:2222``) or a ``Host`` alias of the OpenSSH client
configuration (its ``HostName``, ``User``, ``Port`` and ``IdentityFile`` are used unless
the entry or a fiber setting gives them). ``slots`` is how many one-core jobs the host
takes at once; without it the backend asks the host (``nproc``) once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import paramiko

_ENTRY = re.compile(
    r"""^(?:(?P<user>[^@\s]+)@)?
        (?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:*@\s\[\]]+))
        (?::(?P<port>[0-9]+))?
        (?:\*(?P<slots>[0-9]+))?$""",
    re.VERBOSE,
)

ENTRY_SYNTAX = "[user@]host[:port][*slots], e.g. alice@node1:22*8 or [::1]:2222*2"


class HostSyntaxError(ValueError):
    """An ``ssh_hosts`` entry or hosts-file line cannot be parsed."""


@dataclass(frozen=True)
class HostSpec:
    """One SSH host as configured. ``name`` is the entry as the user wrote it (minus
    slots); it is what jobs report as their ``host``."""

    name: str
    hostname: str
    port: int
    user: str
    key_file: str | None = None
    slots: int | None = None

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def parse_entry(text: str) -> dict[str, Any]:
    """Split one entry into its parts (values not given are ``None``)."""
    match = _ENTRY.match(text.strip())
    if not match:
        raise HostSyntaxError(f"cannot parse SSH host {text!r}: expected {ENTRY_SYNTAX}")
    port = int(match["port"]) if match["port"] else None
    if port is not None and not 0 < port < 65536:
        raise HostSyntaxError(f"bad port in SSH host {text!r}: expected 1-65535")
    slots = int(match["slots"]) if match["slots"] else None
    if slots == 0:
        raise HostSyntaxError(f"bad slot count in SSH host {text!r}: expected at least 1")
    host = match["v6"] or match["host"]
    name = text.strip().split("*", 1)[0]
    return {"name": name, "user": match["user"], "host": host, "port": port, "slots": slots}


def read_hosts_file(path: str) -> list[str]:
    """Entries of a hosts file: one per line, ``#`` starts a comment."""
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise HostSyntaxError(
            f"cannot read the SSH hosts file {path!r} (setting ssh_hosts_file): "
            f"{exc.strerror or exc}"
        ) from None
    entries = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        entries.extend(line.split())
    return entries


def load_ssh_config(path: str | None) -> paramiko.SSHConfig | None:
    """The OpenSSH client configuration at ``path`` (default ``~/.ssh/config`` when it
    exists), or ``None``."""
    explicit = path is not None
    path = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(path):
        if explicit:
            raise HostSyntaxError(
                f"the SSH client config {path!r} (setting ssh_config_file) does not exist"
            )
        return None
    return paramiko.SSHConfig.from_path(path)


def default_user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry
        return "root"


def resolve_hosts(options: Mapping[str, Any]) -> list[HostSpec]:
    """The hosts the settings name, in order, without duplicates."""
    entries: list[str] = list(options.get("ssh_hosts") or [])
    if options.get("ssh_hosts_file"):
        entries.extend(read_hosts_file(options["ssh_hosts_file"]))
    if not entries:
        raise HostSyntaxError(
            "the ssh backend has no hosts: set FIBER_SSH_HOSTS (comma-separated "
            f"{ENTRY_SYNTAX}) or FIBER_SSH_HOSTS_FILE (one entry per line)"
        )
    config = load_ssh_config(options.get("ssh_config_file"))
    hosts: list[HostSpec] = []
    seen: set[tuple[str, int, str]] = set()
    for entry in entries:
        spec = _resolve(parse_entry(entry), config, options)
        key = (spec.hostname, spec.port, spec.user)
        if key in seen:
            continue
        seen.add(key)
        hosts.append(spec)
    return hosts


def _resolve(parts: dict[str, Any], config: paramiko.SSHConfig | None,
             options: Mapping[str, Any]) -> HostSpec:
    looked: dict[str, Any] = config.lookup(parts["host"]) if config is not None else {}
    hostname = looked.get("hostname", parts["host"])
    port = parts["port"] or options.get("ssh_port") or int(looked.get("port", 22))
    user = parts["user"] or options.get("ssh_user") or looked.get("user") or default_user()
    key_file = options.get("ssh_key_file")
    if not key_file and looked.get("identityfile"):
        key_file = os.path.expanduser(_first(looked["identityfile"]))
    return HostSpec(name=parts["name"], hostname=hostname, port=int(port), user=user,
                    key_file=key_file, slots=parts["slots"])


def _first(value: str | Iterable[str]) -> str:
    return value if isinstance(value, str) else next(iter(value))
