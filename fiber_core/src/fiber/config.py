"""``fiber.config``: uber/fiber 0.2's settings module, kept so its programs run.
Deprecated: settings are given with ``fiber.init(name=value)`` and read with
``fiber.runtime.config.get_config()`` (:mod:`fiber.runtime.config`).

As in uber/fiber, the settings are attributes of this module: assigning one
(``fiber.config.log_level = "debug"``, ``import fiber.config as fiber_config;
fiber_config.backend = "local"``) is ``fiber.init(log_level="debug")``, checked at once
(an unknown name or a bad value raises :class:`fiber.errors.ConfigError`, a
``ValueError``); reading one returns its effective value. uber/fiber's own names
(``cpu_per_job``, ``use_push_queue``, ...) are translated or ignored as in every
other source (:data:`fiber.runtime.config.DEPRECATED`). ``Config``, ``get_dict()``,
``get_object()`` and ``init()`` are uber/fiber's. Each spelling warns once with a
:class:`DeprecationWarning` naming the new one.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

from fiber import util
from fiber.runtime import config as _config

__all__ = ["Config", "get_dict", "get_object", "init"]

# what uber/fiber's settings that mean nothing here were last set to (read back as set)
_ignored: dict[str, Any] = {}


def _value(name: str) -> Any:
    values = _config.get_config().values
    if name in values:
        return values[name]
    if name in _config.DEPRECATED:
        new, _ = _config.DEPRECATED[name]
        if name == "debug":
            return values.get("log_level") == "DEBUG"
        if new is not None:
            return values[new]
        return _ignored.get(name)
    raise AttributeError(f"module 'fiber.config' has no attribute {name!r}")


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
        self.__dict__.update(cfg.as_dict())

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
    return _config.get_config().as_dict()


def get_object() -> Config:
    """The effective settings as a :class:`Config` (deprecated: ``get_config()``)."""
    util.warn_deprecated("fiber.config.get_object",
                         "fiber.config.get_object() is deprecated: use "
                         "fiber.runtime.config.get_config()")
    return Config.from_dict(_config.get_config().as_dict())


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
