"""Parsing and checking ``docker_volumes`` entries (``HOST:CONTAINER[:ro|rw]``).

An entry's source is an absolute path on the engine's machine (a bind mount) or the
name of a Docker volume; its target is an absolute path inside the job's container.
Bad entries are rejected with a message that shows the expected form.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_FORM = "expected HOST_PATH:CONTAINER_PATH[:ro|rw] (absolute paths), e.g. /data:/data:ro"


@dataclass(frozen=True)
class Volume:
    """One mount of a job's container."""

    source: str
    target: str
    read_only: bool = False

    @property
    def is_bind(self) -> bool:
        return self.source.startswith("/")

    def __str__(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def parse_volume(text: str) -> Volume:
    """One ``HOST:CONTAINER[:ro|rw]`` entry; raises ``ValueError`` when malformed."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"bad volume {text!r}: {_FORM}")
    source, target = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise ValueError(f"bad volume {text!r}: mode {mode!r} is not ro or rw; {_FORM}")
    if not source.startswith("/") and not _VOLUME_NAME.fullmatch(source):
        raise ValueError(
            f"bad volume {text!r}: the host side {source!r} is neither an absolute path nor a "
            f"volume name (relative paths are not allowed); {_FORM}"
        )
    if not target.startswith("/"):
        raise ValueError(
            f"bad volume {text!r}: the container side {target!r} is not an absolute path; {_FORM}"
        )
    return Volume(posixpath.normpath(source) if source.startswith("/") else source,
                  posixpath.normpath(target), mode == "ro")


def parse_volumes(value: str | Iterable[str]) -> list[str]:
    """The ``docker_volumes`` setting: a list, or text with entries separated by commas
    or newlines. Returns the entries in normal form; raises ``ValueError``."""
    items = re.split(r"[,\n]", value) if isinstance(value, str) else list(value)
    volumes = [parse_volume(str(item)) for item in items if str(item).strip()]
    targets: set[str] = set()
    for volume in volumes:
        if volume.target in targets:
            raise ValueError(f"two volumes are mounted at {volume.target!r}; keep one")
        targets.add(volume.target)
    return [str(volume) for volume in volumes]


def is_under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it (both absolute, normalised)."""
    return path == root or path.startswith(root.rstrip("/") + "/")
