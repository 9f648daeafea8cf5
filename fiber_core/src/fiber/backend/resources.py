"""``Resources``: what one job asks its cluster for, in the contract so that every
backend reads the same type.

The typed part (``cpu`` cores, ``memory`` in MiB, ``gpu`` devices, ``walltime`` in
seconds) means the same on every backend; ``extra`` holds what only one cluster knows,
keyed by backend name (``{"slurm": {"partition": "debug"}, "kubernetes":
{"node_selector": {"disk": "ssd"}}}``): a backend reads its own entry and ignores the
others', so one request can be given to contexts of different backends. Values are
checked when the object is made; whether a backend can honour them is its
:meth:`fiber.backend.Backend.check_resources`, asked before any job starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from fiber.backend.options import parse_memory, parse_nonnegative_int, parse_positive_float
from fiber.errors import ConfigError

__all__ = ["Resources", "parse_walltime"]

_WALLTIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_walltime(value: int | float | str) -> int:
    """Seconds from a number of seconds or Slurm's forms: ``"MM"``, ``"MM:SS"``,
    ``"HH:MM:SS"``, ``"D-HH"``, ``"D-HH:MM"``, ``"D-HH:MM:SS"``."""
    if isinstance(value, bool):
        raise ConfigError(f"walltime must be seconds or [D-]HH:MM:SS, not {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"walltime must be positive, not {value!r}")
        return int(-(-value // 1))
    match = _WALLTIME.match(str(value).strip())
    if not match:
        raise ConfigError(f"walltime must be seconds or [D-]HH:MM:SS, not {value!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = (int(days) * 24 + int(first)) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:  # HH:MM:SS
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:  # MM:SS
        seconds = int(first) * 60 + int(second)
    else:  # MM
        seconds = int(first) * 60
    if seconds <= 0:
        raise ConfigError(f"walltime must be positive, not {value!r}")
    return seconds


def _frozen_extra(extra: Mapping[str, Any] | None) -> Mapping[str, Mapping[str, Any]]:
    if extra is None:
        return MappingProxyType({})
    if not isinstance(extra, Mapping):
        raise ConfigError("Resources(extra=...) must map backend names to mappings, e.g. "
                          "{'slurm': {'partition': 'debug'}}")
    out: dict[str, Mapping[str, Any]] = {}
    for backend, requests in extra.items():
        if not isinstance(requests, Mapping):
            raise ConfigError(f"Resources(extra=...)[{backend!r}] must be a mapping of "
                              f"request names to values, not {requests!r}")
        out[str(backend)] = MappingProxyType(dict(requests))
    return MappingProxyType(out)


@dataclass(frozen=True)
class Resources:
    """A job's resource request: ``Resources(cpu=2, memory="4G", gpu=1,
    walltime="1:00:00", extra={"slurm": {"partition": "debug"}})``. ``None`` means
    "no request" (the settings' value, if any, applies). ``memory`` accepts MiB or a
    size (``"512M"``, ``"4G"``), ``walltime`` seconds or ``[D-]HH:MM:SS``; both are
    stored as numbers (MiB, seconds)."""

    cpu: float | None = None
    memory: int | None = None
    gpu: int | None = None
    walltime: int | None = None
    extra: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        parsers = (("cpu", parse_positive_float), ("memory", parse_memory),
                   ("gpu", parse_nonnegative_int))
        for name, parse in parsers:
            value = getattr(self, name)
            if value is None:
                continue
            try:
                put(name, parse(value))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"bad {name} request {value!r}: {exc}") from None
        if self.walltime is not None:
            put("walltime", parse_walltime(self.walltime))
        put("extra", _frozen_extra(self.extra))

    @classmethod
    def of(cls, value: Resources | Mapping[str, Any] | None) -> Resources:
        """``value`` as Resources (a mapping gives the constructor's keywords)."""
        if value is None:
            return cls()
        if isinstance(value, Resources):
            return value
        if isinstance(value, Mapping):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ConfigError(f"unknown resource request {unknown[0]!r}: requests are "
                                  f"{', '.join(sorted(names))} (what only one cluster "
                                  "knows goes in extra={backend: {...}})")
            return cls(**value)
        raise ConfigError(f"resources must be fiber.Resources or a mapping, not {value!r}")

    def merged(self, other: Resources | None) -> Resources:
        """These requests with ``other``'s on top (its non-None values win; ``extra``
        merges per backend, key by key)."""
        if other is None:
            return self
        extra = {name: dict(requests) for name, requests in self.extra.items()}
        for name, requests in other.extra.items():
            extra.setdefault(name, {}).update(requests)
        return Resources(
            cpu=other.cpu if other.cpu is not None else self.cpu,
            memory=other.memory if other.memory is not None else self.memory,
            gpu=other.gpu if other.gpu is not None else self.gpu,
            walltime=other.walltime if other.walltime is not None else self.walltime,
            extra=extra)

    def scaled(self, n: int) -> Resources:
        """The request of a job that runs ``n`` of what this asks for: ``cpu``,
        ``memory`` and ``gpu`` times ``n``; ``walltime`` and ``extra`` as they are."""
        return Resources(
            cpu=None if self.cpu is None else self.cpu * n,
            memory=None if self.memory is None else self.memory * n,
            gpu=None if self.gpu is None else self.gpu * n,
            walltime=self.walltime,
            extra={name: dict(requests) for name, requests in self.extra.items()})

    def __repr__(self) -> str:
        parts = [f"{name}={getattr(self, name)!r}" for name in ("cpu", "memory", "gpu",
                                                                 "walltime")
                 if getattr(self, name) is not None]
        if self.extra:
            extra = {name: dict(requests) for name, requests in self.extra.items()}
            parts.append(f"extra={extra!r}")
        return f"Resources({', '.join(parts)})"

    def extra_for(self, backend: str) -> dict[str, Any]:
        """The requests only backend ``backend`` knows (a copy; empty if none)."""
        return dict(self.extra.get(backend, {}))

    def __reduce__(self) -> tuple[Any, ...]:  # the mapping proxies do not pickle
        extra = {name: dict(requests) for name, requests in self.extra.items()}
        return (Resources, (self.cpu, self.memory, self.gpu, self.walltime, extra))
