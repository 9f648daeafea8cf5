"""``fiber.config``: uber/fiber 0.2's settings module, kept so its programs run.
Deprecated: settings are given with ``fiber.init(name=value)`` and read with
``fiber.runtime.config.get_config()`` (:mod:`fiber.runtime.config`).

As in uber/fiber, the settings are attributes of this module: assigning one
(``fiber.config.log_level = "debug"``, ``import fiber.config as fiber_config;
fiber_config.backend = "local"``) is ``fiber.init(log_level="debug")``, checked at once
(an unknown name or a bad value raises :class:`fiber.errors.ConfigError`, a
``ValueError``); reading one returns its effective value, with uber/fiber's type and
default: ``log_level`` reads a :mod:`logging` level number (``logging.WARNING``, fiber's
default level; fiber's own settings keep the name, ``"WARNING"``), ``cpu_per_job``
an int, 1 when no ``cpu`` is set. uber/fiber's own names (``cpu_per_job``,
``use_push_queue``, ...) are translated or ignored as in every other source
(:data:`fiber.runtime.config.DEPRECATED`); the ignored ones read back as last set, else
as uber/fiber's default. ``Config``, ``get_dict()``, ``get_object()`` and ``init()``
are uber/fiber's (the first three give uber/fiber's names beside fiber's). Each
spelling warns once with a :class:`DeprecationWarning` naming the new one.
"""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

from fiber import util
from fiber.runtime import config as _config

__all__ = ["Config", "get_dict", "get_object", "init"]

# what uber/fiber's settings that mean nothing here were last set to (read back as set)
_ignored: dict[str, Any] = {}

# uber/fiber 0.2's defaults of its settings that have no value of their own here
# (cpu_per_job: one core per job, which a job of fiber's asks for when nothing is said)
_UBER_DEFAULTS: dict[str, Any] = {
    "cpu_per_job": 1, "log_file": "/tmp/fiber.log", "merge_output": False,
    "ipc_admin_master_port": 0, "ipc_admin_worker_port": 8000, "ipc_active": True,
    "use_bash": False, "use_push_queue": True,
}


def _value(name: str, values: dict[str, Any] | None = None) -> Any:
    """The effective value of setting ``name`` (in ``values``, default: this process's
    settings) as uber/fiber's programs read it: its names, types and defaults
    (``log_level`` a :mod:`logging` level number, ``cpu_per_job`` an int, 1 when
    unset); fiber's own settings as they are."""
    if values is None:
        values = _config.get_config().values
    if name == "log_level":
        return logging.getLevelName(values["log_level"])  # "INFO" -> logging.INFO
    if name in values:
        return values[name]
    if name in _config.DEPRECATED:
        new, _ = _config.DEPRECATED[name]
        if name == "debug":
            return values.get("log_level") == "DEBUG"
        if new is not None:
            value = values[new]
            if name == "cpu_per_job" and value is not None and value == int(value):
                value = int(value)  # uber/fiber's type
        else:
            value = _ignored.get(name)
        return _UBER_DEFAULTS.get(name) if value is None else value
    raise AttributeError(f"module 'fiber.config' has no attribute {name!r}")


def _uber_dict(cfg: _config.Config | None = None) -> dict[str, Any]:
    """The settings ``cfg`` (default: this process's) with uber/fiber's names too, as
    its ``get_dict()`` and ``Config`` gave them (its types and defaults, :func:`_value`)."""
    values = (cfg or _config.get_config()).as_dict()
    out = dict(values)
    out["log_level"] = _value("log_level", values)
    for name in _config.DEPRECATED:
        out[name] = _value(name, values)
    return out


class Config:
    """uber/fiber's configuration object: the effective settings as attributes
    (``conf_file``: read that ``.fiberconfig`` file on top of the others, as
    uber/fiber read it instead of ``./.fiberconfig``). Deprecated: use
    ``fiber.runtime.config.get_config()``."""

    def __init__(self, conf_file: str | None = None) -> None:
        util.warn_deprecated("fiber.config.Config",
                             "fiber.config.Config is deprecated: use "
                             "fiber.runtime.config.get_config()")
        cfg = _config.get_config()
        if conf_file is not None:
            path = Path(conf_file)
            cfg = _config.overlay(cfg, _config._read_file(path), str(path))
        self.__dict__.update(_uber_dict(cfg))

    def __repr__(self) -> str:
        return repr(self.__dict__)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        obj = cls.__new__(cls)
        obj.__dict__.update(values)
        return obj


def get_dict() -> dict[str, Any]:
    """The effective settings (deprecated: ``get_config().as_dict()``)."""
    util.warn_deprecated("fiber.config.get_dict",
                         "fiber.config.get_dict() is deprecated: use "
                         "fiber.runtime.config.get_config().as_dict()")
    return _uber_dict()


def get_object() -> Config:
    """The effective settings as a :class:`Config` (deprecated: ``get_config()``)."""
    util.warn_deprecated("fiber.config.get_object",
                         "fiber.config.get_object() is deprecated: use "
                         "fiber.runtime.config.get_config()")
    return Config.from_dict(_uber_dict())


def init(**settings: Any) -> list[str]:
    """Set settings in code; returns the names whose values changed, as uber/fiber's
    (deprecated: ``fiber.init(**settings)``)."""
    util.warn_deprecated("fiber.config.init",
                         "fiber.config.init() is deprecated: use fiber.init()")
    before = _config.get_config().as_dict()
    after = _config.init(**settings).as_dict()
    return [name for name, value in after.items() if before.get(name) != value]


class _SettingsModule(types.ModuleType):
    """This module, whose unknown attributes are the settings."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _value(name)
        if name in _config.DEPRECATED:
            advice = _config.DEPRECATED[name][1]
            util.warn_deprecated(f"fiber.config.{name}",
                                 f"fiber.config.{name} is deprecated: {advice}")
        else:
            util.warn_deprecated(f"fiber.config.{name}",
                                 f"reading fiber.config.{name} is deprecated: use "
                                 f"fiber.runtime.config.get_config().{name}")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_") or name in __all__:
            super().__setattr__(name, value)
            return
        if name not in _config.DEPRECATED:  # (those warn as in every source)
            util.warn_deprecated(f"fiber.config.{name} =",
                                 f"setting fiber.config.{name} is deprecated: use "
                                 f"fiber.init({name}=...)")
        _config.init(**{name: value})
        if name in _config.DEPRECATED and _config.DEPRECATED[name][0] is None:
            _ignored[name] = value


sys.modules[__name__].__class__ = _SettingsModule
