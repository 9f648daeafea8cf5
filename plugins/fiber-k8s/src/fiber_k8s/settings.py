"""Parsers of the ``kubernetes_*`` settings that have structure (node selectors,
tolerations, volumes). Each raises ``ValueError`` with the expected syntax."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from fiber.backend import parse_list

EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _items(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return parse_list(str(value))


def parse_key_values(value: Any) -> dict[str, str]:
    """``key=value,key=value`` (or a dict) into a dict."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    result = {}
    for item in _items(value):
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {item!r}")
        result[key] = val
    return result


def parse_node_selector(value: Any) -> list[str]:
    """``key=value`` items, kept as text so that children get the same setting."""
    return [f"{k}={v}" for k, v in parse_key_values(value).items()]


@dataclass(frozen=True)
class Toleration:
    key: str
    value: str | None
    effect: str

    def __str__(self) -> str:  # the setting's syntax, for children's environment
        return f"{self.key}{'' if self.value is None else '=' + self.value}:{self.effect}"

    def manifest(self) -> dict[str, str]:
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


def parse_tolerations(value: Any) -> list[Toleration]:
    """``key[=value]:Effect`` items."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, Toleration) for v in value):
        return list(value)
    result = []
    for item in _items(value):
        head, sep, effect = item.rpartition(":")
        if not sep or effect not in EFFECTS or not head:
            raise ValueError(
                f"expected key[=value]:Effect with Effect one of {', '.join(EFFECTS)}, got {item!r}"
            )
        key, eq, val = head.partition("=")
        result.append(Toleration(key, val if eq else None, effect))
    return result


@dataclass(frozen=True)
class Mount:
    source: str  # claim name or host path
    path: str  # mount path in the pod
    read_only: bool = False

    def __str__(self) -> str:  # the setting's syntax, for children's environment
        return f"{self.source}:{self.path}{':ro' if self.read_only else ''}"


def _split_mount(item: str) -> tuple[list[str], bool]:
    parts = item.split(":")
    read_only = False
    if parts[-1] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    return parts, read_only


def parse_volumes(value: Any) -> list[Mount]:
    """``claim:/mount/path[:ro]`` items (persistent volume claims)."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, Mount) for v in value):
        return list(value)
    result = []
    for item in _items(value):
        parts, read_only = _split_mount(item)
        if len(parts) != 2 or not _DNS_LABEL.fullmatch(parts[0]) or not parts[1].startswith("/"):
            raise ValueError(
                f"expected claim-name:/absolute/mount/path[:ro], got {item!r}"
            )
        result.append(Mount(parts[0], parts[1], read_only))
    return result


def parse_host_paths(value: Any) -> list[Mount]:
    """``/host/path[:/pod/path][:ro]`` items."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, Mount) for v in value):
        return list(value)
    result = []
    for item in _items(value):
        parts, read_only = _split_mount(item)
        if len(parts) == 1:
            parts.append(parts[0])
        if len(parts) != 2 or not all(p.startswith("/") for p in parts):
            raise ValueError(f"expected /host/path[:/pod/path][:ro], got {item!r}")
        result.append(Mount(parts[0], parts[1], read_only))
    return result
