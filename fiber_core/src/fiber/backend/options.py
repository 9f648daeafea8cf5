"""Declaring settings: the :class:`ConfigOption` type and the value parsers.

The core and every plugin declare their settings as ``ConfigOption`` objects (plugins
through the ``fiber_config_options`` hook). A setting named ``docker_network`` is
read from ``fiber.init(docker_network=...)``, from the environment variable
``FIBER_DOCKER_NETWORK`` and from the key ``docker_network`` of a ``.fiberconfig``
file, in that order of precedence. Each option parses text into a typed value and
rejects bad values with a message that says what is expected.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fiber.errors import ConfigError


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected one of true/false, yes/no, on/off, 1/0")


def parse_list(text: str) -> list[str]:
    """Comma- or whitespace-separated words."""
    return [item for item in re.split(r"[,\s]+", text.strip()) if item]


_MEMORY_UNITS = {
    "": 1, "m": 1, "mi": 1, "mb": 1, "mib": 1,
    "g": 1024, "gi": 1024, "gb": 1024, "gib": 1024,
    "t": 1024 * 1024, "ti": 1024 * 1024, "tb": 1024 * 1024, "tib": 1024 * 1024,
    "k": 1 / 1024, "ki": 1 / 1024, "kb": 1 / 1024, "kib": 1 / 1024,
}


def parse_memory(text: str | int | float) -> int:
    """A memory size in MiB: ``512``, ``"512M"``, ``"4G"``, ``"1.5Gi"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError("memory must be positive")
        return int(text)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _MEMORY_UNITS:
        raise ValueError("expected a size such as 512, 512M, 4G or 1.5Gi (MiB when no unit)")
    mib = float(match.group(1)) * _MEMORY_UNITS[match.group(2).lower()]
    if mib <= 0:
        raise ValueError("memory must be positive")
    return max(1, int(mib))


def parse_positive_float(text: str | int | float) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("expected a positive number")
    return value


def parse_positive_int(text: str | int) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("expected a positive whole number")
    return value


def parse_nonnegative_int(text: str | int) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("expected a whole number >= 0")
    return value


@dataclass(frozen=True)
class ConfigOption:
    """One setting. ``parse`` turns text (from the environment or a file) or a value
    given in code into the typed value; it raises ``ValueError`` with a human message
    for bad input. ``choices`` restricts the parsed value."""

    name: str
    parse: Callable[[Any], Any] = str
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None

    @property
    def env_var(self) -> str:
        return "FIBER_" + self.name.upper()

    def convert(self, raw: Any, source: str) -> Any:
        """Parse ``raw`` (from ``source``, used in the error message)."""
        if raw is None:
            return None
        try:
            if isinstance(raw, str) or self.parse in (str,):
                value = self.parse(raw)
            elif self.parse is parse_bool:
                value = bool(raw)
            elif self.parse is parse_list and isinstance(raw, (list, tuple)):
                value = [str(item) for item in raw]
            else:
                value = self.parse(raw)
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"bad value {raw!r} for setting {self.name!r} (from {source}): {exc}"
            ) from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"bad value {raw!r} for setting {self.name!r} (from {source}): "
                f"expected one of {', '.join(map(str, self.choices))}"
            )
        return value
