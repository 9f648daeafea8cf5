"""Settings: the core's options and how every option's effective value is found.

Precedence: ``fiber.init(key=value)`` in code, then the environment variable
``FIBER_<KEY>``, then a ``.fiberconfig`` file (INI, section ``[default]``; the one in
the working directory beats the one in the home directory, and ``FIBER_CONFIG_FILE``
names another), then the option's default. Unknown keys and bad values raise
:class:`fiber.errors.ConfigError` naming the key, the value and where it came from.

An empty value (``FIBER_BACKEND=``, or ``backend =`` in a file) is the same as not
setting it. In a file, one pair of quotes around a value is removed (``backend =
"local"`` is ``local``), as users of TOML and shell files write them; a quote at one
end only is an error naming the file and line. A file named by
``FIBER_CONFIG_FILE`` must exist; a file that cannot be read or is not UTF-8 text is a
``ConfigError`` naming it.

The settings of uber/fiber 0.2 (``cpu_per_job``, ``mem_per_job``, ``default_backend``,
``default_image``, ``debug``, ``log_file``, ...) are accepted in every source, each with
a one-time :class:`DeprecationWarning` naming its new spelling (:data:`DEPRECATED`);
those that mean nothing to this fiber are ignored, with that word.
"""

from __future__ import annotations

import configparser
import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiber import util
from fiber.backend import registry
from fiber.backend.options import (
    ConfigOption,
    parse_bool,
    parse_memory,
    parse_nonnegative_int,
    parse_positive_float,
    parse_positive_int,
)
from fiber.errors import BackendNotFoundError, ConfigError, PluginContractError

logger = logging.getLogger("fiber")

ENV_PREFIX = "FIBER_"
# Variables the core uses to talk to its own children; not settings.
INTERNAL_ENV_PREFIX = "_FIBER_"
NOT_SETTINGS = {"FIBER_CONFIG_FILE"}


def _nonnegative_float(text: str | int | float) -> float:
    value = float(text)
    if not value >= 0:  # (NaN too)
        raise ValueError("expected a number >= 0")
    return value


SHIP_WORDS = ("auto", "off", "on")


def parse_ship(value: Any) -> list[str]:
    """The ``ship`` setting: ``auto``, ``off``, ``on`` or what to ship (:mod:`fiber.runtime.ship.plan`)."""
    if isinstance(value, str):
        items = [item for item in value.replace(",", " ").split() if item]
    elif isinstance(value, (list, tuple)):
        items = [str(item).strip() for item in value if str(item).strip()]
    else:
        raise ValueError("expected auto, off, on, or a list of what to ship")
    if not items:
        return ["auto"]
    if "off" in items and len(items) > 1:
        raise ValueError("'off' ships nothing: it cannot come with other items")
    if "auto" in items and len(items) > 1:
        raise ValueError("'auto' lets the backend decide: it cannot come with other items")
    for item in items:
        kind, _, rest = item.partition(":")
        if kind in ("pkg", "package", "req", "requirements") and not rest:
            raise ValueError(f"{item!r} names nothing after the colon")
    return items


def parse_log_level(value: Any) -> str:
    """A level name (any case) or a :mod:`logging` level number (``logging.INFO``)."""
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        name = logging.getLevelName(int(value))
        if not isinstance(name, str) or name.startswith("Level "):
            raise ValueError(f"{value} is not a level of the logging module")
        return name
    return str(value).upper()


CORE_OPTIONS = [
    ConfigOption("backend", str, "local", "the backend that runs job-backed processes"),
    ConfigOption("image", str, None, "container image of jobs (container backends)"),
    ConfigOption("image_registry", str, None,
                 "registry that `fiber build` and `fiber run --build` push images to, "
                 "host:port[/path] (default: none, the image stays on the builder's engine)"),
    ConfigOption("image_base", str, None,
                 "image a generated image starts from: it must have python3 of the "
                 "launching Python's version (default: python:X.Y-slim)"),
    ConfigOption("image_builder", str, None,
                 "image builder of `fiber build` (default: the one installed)"),
    ConfigOption("cpu", parse_positive_float, None,
                 "cores requested per job (the local backend does not enforce it)"),
    ConfigOption("memory", parse_memory, None, "memory requested per job, MiB (accepts "
                 "4G; the local backend does not enforce it)"),
    ConfigOption("gpu", parse_nonnegative_int, None,
                 "GPUs requested per job (the local backend refuses it)"),
    ConfigOption(
        "log_level", parse_log_level, "WARNING", "level of the 'fiber' logger",
        ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    ),
    ConfigOption("listen_address", str, None,
                 "address this process listens on for its jobs (default: the backend's)"),
    ConfigOption("output_prefix", parse_bool, False,
                 "prefix each line a child prints with its process name"),
    ConfigOption("progress", parse_bool, False,
                 "show a progress bar for a Pool map or imap that runs longer than 2 s, "
                 "on a terminal (stderr) or in a notebook; needs rich or tqdm "
                 "(pip install 'fiber-core[top]')"),
    ConfigOption("heartbeat_interval", parse_positive_float, 5.0,
                 "seconds between heartbeats from a parent to its children (at most a "
                 "third of heartbeat_timeout)"),
    ConfigOption("heartbeat_timeout", parse_positive_float, 30.0,
                 "a peer silent this many seconds is taken for dead (a dropped "
                 "connection is noticed at once; this is for hosts cut off)"),
    ConfigOption("max_task_attempts", parse_positive_int, 3,
                 "times a Pool task may lose its worker before it fails"),
    ConfigOption("python", str, None, "Python executable of jobs (default: this one; "
                 "python3.X, this one's version, for jobs that get a shipment)"),
    ConfigOption("ship", parse_ship, ["auto"],
                 "what jobs get from this machine: auto (only when the backend's jobs do "
                 "not share its files), off, on (the main script's directory, fiber-core, "
                 "the backend's plugin and what they require), or a list of what to "
                 "ship as well (directories, files, modules, pkg:NAME, req:FILE; implies "
                 "on): see docs/laptop-to-cluster.md"),
    ConfigOption("ship_limit", parse_memory, 512,
                 "MiB of files one shipped archive may hold, before compression (more is "
                 "an error naming the largest files)"),
    ConfigOption("ship_cache", str, None,
                 "directory of the shipped files' cache on each host (default: "
                 "<tmp>/fiber-ship-<uid> there; private to the user)"),
    ConfigOption("ship_cache_size", parse_memory, 4096,
                 "MiB the shipped files' cache of a host keeps; beyond it, the entries "
                 "used least recently and by no running job are removed"),
    ConfigOption("shared_memory", parse_bool, True,
                 "share memory with processes of this host (large queue messages, Lock, "
                 "Value, Array...); false: use them as processes of another host do, "
                 "through their creator"),
    ConfigOption("backend_retry_timeout", _nonnegative_float, 180.0,
                 "seconds for which a backend's transient errors (an unreachable or "
                 "overloaded cluster manager) are retried before fiber gives up; 0: "
                 "fail at once"),
]


# uber/fiber 0.2's settings: old name -> (new name, or None when the setting is ignored;
# what to say about it)
DEPRECATED: dict[str, tuple[str | None, str]] = {
    "cpu_per_job": ("cpu", "use 'cpu'"),
    "mem_per_job": ("memory", "use 'memory' (MiB, or '4G')"),
    "default_backend": ("backend", "use 'backend'"),
    "default_image": ("image", "use 'image'"),
    "debug": ("log_level", "use log_level='DEBUG'"),
    "log_file": (None, "ignored: fiber logs through the 'fiber' logger; add a handler "
                       "to it (e.g. fiber.log_to_stderr())"),
    "merge_output": (None, "ignored: children's output always reaches the parent's "
                           "(output_prefix names them)"),
    "ipc_admin_master_port": (None, "ignored: use listen_address"),
    "ipc_admin_worker_port": (None, "ignored: children always connect to their parent"),
    "ipc_active": (None, "ignored: children always connect to their parent"),
    "use_bash": (None, "ignored"),
    "use_push_queue": (None, "ignored"),
}


def _old_spellings(settings: Mapping[str, Any]) -> dict[str, str]:
    """The new names whose value ``settings`` give under uber/fiber 0.2's name (no new
    name beside it): new name -> old name."""
    return {new: key for key, (new, _) in DEPRECATED.items()
            if key in settings and new is not None and new not in settings}


class _WouldWarn(Exception):
    """Settings that use a deprecated name, computed with ``quiet=True``."""


def _translate(settings: Mapping[str, Any], source: str,
               quiet: bool = False) -> dict[str, Any]:
    """``settings`` with uber/fiber 0.2's names replaced by the new ones (warning once
    per name; with ``quiet``, raising :class:`_WouldWarn` instead); a new name given
    in the same source wins."""
    if not any(key in DEPRECATED for key in settings):
        return dict(settings)
    if quiet:
        raise _WouldWarn(source)
    out = {key: value for key, value in settings.items() if key not in DEPRECATED}
    for key, value in settings.items():
        if key not in DEPRECATED:
            continue
        new, advice = DEPRECATED[key]
        util.warn_deprecated(f"setting {key}",
                             f"fiber setting {key!r} (from {source}) is deprecated: {advice}")
        if new is None or new in out:
            continue
        if key == "debug":
            if value if isinstance(value, bool) else parse_bool(str(value)):
                out[new] = "DEBUG"
            continue
        out[new] = value
    return out


@dataclass
class Config:
    """The effective settings of this process."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    options: dict[str, ConfigOption] = field(default_factory=dict)
    #: settings whose value was given under uber/fiber 0.2's name, new name -> old
    #: (``cpu`` given as ``cpu_per_job``: a Pool then packs workers into jobs as
    #: uber/fiber did, :func:`fiber.runtime.pool.placement.uber_packing`)
    old_names: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def child_env(self) -> dict[str, str]:
        """``FIBER_*`` variables that give a child process the same settings."""
        env = {}
        for name, value in self.values.items():
            if self.sources.get(name, "default") == "default" or value is None:
                continue
            if isinstance(value, (list, tuple)):
                text = ",".join(map(str, value))
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            env[self.options[name].env_var] = text
        return env


_lock = threading.RLock()
_code_settings: dict[str, Any] = {}
_current: Config | None = None


def config_files(environ: Mapping[str, str] | None = None,
                 cwd: str | None = None) -> list[Path]:
    """The ``.fiberconfig`` files read, lowest precedence first (for a process with
    ``environ`` and working directory ``cwd``; default: this one's)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("FIBER_CONFIG_FILE")
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise ConfigError(
                f"FIBER_CONFIG_FILE names {explicit}, which does not exist: create it "
                "(settings under a [default] section) or unset FIBER_CONFIG_FILE")
        if path.is_dir():
            raise ConfigError(
                f"FIBER_CONFIG_FILE names {explicit}, which is a directory: name a file "
                f"(such as {path / '.fiberconfig'}) or unset FIBER_CONFIG_FILE")
        if not path.is_absolute() and cwd is not None:
            path = Path(cwd) / path
        return [path]
    home = Path(environ["HOME"]) if environ is not os.environ and environ.get("HOME") \
        else Path.home()
    candidates = [home / ".fiberconfig", Path(cwd or os.getcwd()) / ".fiberconfig"]
    return [path for path in candidates if path.is_file()]


def _unquoted(value: str, key: str, path: Path, text: str) -> str:
    """``value`` without the one pair of quotes around it; a quote at one end only
    (``backend = "local``) is a :class:`ConfigError` naming the file and line."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value[:1] in ("'", '"') or value[-1:] in ("'", '"'):
        quote = value[0] if value[:1] in ("'", '"') else value[-1]
        raise ConfigError(
            f"{path}{_line_of(key, text)}: the value of {key!r} ({value}) has an "
            f"unbalanced quote ({quote}): put the value between two quotes or none")
    return value


def _line_of(key: str, text: str) -> str:
    """``", line N"`` of the line that sets ``key`` in the ``[default]`` section of a
    file's ``text`` ("" when it cannot be told)."""
    import re

    section = None
    pattern = re.compile(rf"\s*{re.escape(key)}\s*[=:]", re.IGNORECASE)
    for number, line in enumerate(text.splitlines(), 1):
        header = re.match(r"\s*\[([^\]]*)\]", line)
        if header:
            section = header.group(1)
        elif section == "default" and pattern.match(line):
            return f", line {number}"
    return ""


def _read_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"cannot read {path}: it is not UTF-8 text (byte {exc.object[exc.start]:#04x} "
            f"at offset {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    parser = configparser.ConfigParser()
    try:
        parser.read_string(text, source=str(path))
    except configparser.MissingSectionHeaderError as exc:
        raise ConfigError(
            f"{path}, line {exc.lineno}: {exc.line.strip()!r} comes before any section "
            "header: put settings under a [default] section (a line [default] above "
            "them)") from None
    except configparser.Error as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not parser.has_section("default") and parser.sections():
        raise ConfigError(f"{path}: put settings under a [default] section")
    if not parser.has_section("default"):
        return {}
    return {key: _unquoted(value.strip(), key, path, text)
            for key, value in parser["default"].items()}


def _unknown(key: str, source: str, options: Mapping[str, ConfigOption]) -> ConfigError:
    import difflib

    close = difflib.get_close_matches(key, list(options), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"unknown setting {key!r} (from {source}){hint} "
        "(a plugin's settings are known only when the plugin is installed; "
        "`fiber config` lists every setting)"
    )


def _check_backend(name: Any) -> None:
    """``fiber.init(backend=name)`` names an installed backend, or raises here (not at
    the first job), with the closest installed name and how to install it."""
    import difflib

    installed = registry.backends()
    # (a backend that cannot be used: its plugin broken, or its class, imported here
    # as its first job would, not implementing the contract)
    fault = registry.backend_fault(name) if isinstance(name, str) else None
    if fault is not None:
        raise PluginContractError(f"fiber.init(): {fault}")
    if name in installed:
        return
    close = difflib.get_close_matches(str(name), list(installed), n=1)
    mean = f"did you mean {close[0]!r}? " if close else ""
    raise BackendNotFoundError(
        f"fiber.init(): no installed plugin provides the fiber backend {name!r} "
        f"({mean}installed backends: {', '.join(sorted(installed)) or 'none'}); "
        f"{registry.install_hint(str(name))}")


def load(code_settings: Mapping[str, Any] | None = None) -> Config:
    """Compute the effective settings from defaults, files, environment and code."""
    cfg = _compute(code_settings, os.environ, None)
    _apply(cfg)
    return cfg


def _compute(code_settings: Mapping[str, Any] | None, environ: Mapping[str, str],
             cwd: str | None, quiet: bool = False) -> Config:
    """The effective settings of a process with ``environ`` and working directory
    ``cwd`` (None: this one's), without applying them (``quiet``: see
    :func:`_translate`)."""
    options = {opt.name: opt for opt in [*CORE_OPTIONS, *registry.config_options()]}
    cfg = Config(options=options)
    for name, opt in options.items():
        cfg.values[name] = opt.default
        cfg.sources[name] = "default"
    for path in config_files(environ, cwd):
        in_file = _read_file(path)
        for key, raw in _translate(in_file, str(path), quiet).items():
            if key not in options:
                raise _unknown(key, str(path), options)
            if not raw:
                continue  # empty: as if not set
            cfg.values[key] = options[key].convert(raw, str(path))
            cfg.sources[key] = str(path)
            _spelled(cfg, key, in_file)
    from_env = {var[len(ENV_PREFIX):].lower(): raw for var, raw in environ.items()
                if var.startswith(ENV_PREFIX) and var not in NOT_SETTINGS}
    for key, raw in _translate(from_env, "the environment", quiet).items():
        var = ENV_PREFIX + key.upper()
        if key not in options:
            raise _unknown(key, f"environment variable {var}", options)
        if not raw:
            continue  # FIBER_X= is the same as unset
        cfg.values[key] = options[key].convert(raw, f"environment variable {var}")
        cfg.sources[key] = "environment"
        _spelled(cfg, key, from_env)
    for key, raw in _translate(code_settings or {}, "fiber.init()").items():
        if key not in options:
            raise _unknown(key, "fiber.init()", options)
        cfg.values[key] = options[key].convert(raw, "fiber.init()")
        cfg.sources[key] = "code"
        _spelled(cfg, key, code_settings or {})
    return cfg


def _spelled(cfg: Config, key: str, settings: Mapping[str, Any]) -> None:
    """Record whether ``key``'s value, just taken from ``settings``, was given under
    uber/fiber's name (:attr:`Config.old_names`); a later source's wins."""
    old = _old_spellings(settings).get(key)
    if old is None:
        cfg.old_names.pop(key, None)
    else:
        cfg.old_names[key] = old


def _apply(cfg: Config) -> None:
    """Make ``cfg``'s settings that act on this process's modules take effect."""
    fiber_logger = logging.getLogger("fiber")
    level = cfg.values.get("log_level") or "WARNING"
    if logging.getLevelName(fiber_logger.level) != level:  # (setting it clears caches)
        fiber_logger.setLevel(level)
    if not cfg.values.get("shared_memory", True) or "fiber.wire.shm" in sys.modules:
        from fiber.wire import shm  # imported only when it matters: start-up time

        shm.enable(bool(cfg.values.get("shared_memory", True)))


def overlay(base: Config, settings: Mapping[str, Any], source: str) -> Config:
    """``base`` with ``settings`` on top, each validated as ``fiber.init`` validates
    its own (an unknown setting or a bad value raises ConfigError naming it and
    ``source``). The overrides count as given in code (children get them)."""
    cfg = Config(dict(base.values), dict(base.sources), base.options, dict(base.old_names))
    for key, raw in _translate(settings, source).items():
        if key not in cfg.options:
            raise _unknown(key, source, cfg.options)
        cfg.values[key] = cfg.options[key].convert(raw, source)
        cfg.sources[key] = "code"
        _spelled(cfg, key, settings)
    return cfg


_prepared: dict[tuple[Any, ...], Config | None] = {}


def _fingerprint(environ: Mapping[str, str], cwd: str) -> tuple[Any, ...]:
    """What the settings of a process with ``environ`` in ``cwd`` are computed from:
    its ``FIBER_*`` variables, its home and working directories, and the identity of
    each settings file that could be read (its path, inode, size and modification
    time in ns; None when absent)."""
    fiber_vars = tuple(sorted((k, v) for k, v in environ.items() if k.startswith(ENV_PREFIX)))
    files: list[tuple[str, Any]] = []
    try:
        paths = config_files(environ, cwd)
    except ConfigError:
        paths = []
    for path in {*paths, Path(cwd) / ".fiberconfig"}:
        try:
            st = os.stat(path)
            files.append((str(path), (st.st_ino, st.st_size, st.st_mtime_ns)))
        except OSError:
            files.append((str(path), None))
    return fiber_vars, environ.get("HOME"), cwd, tuple(sorted(files))


def prepare_for_child(environ: Mapping[str, str], cwd: str) -> None:
    """In a process about to fork a fiber job that will run with ``environ`` in
    ``cwd`` (the local backend's template): compute that job's settings here, once for
    all jobs with the same inputs (:func:`_fingerprint`), and make them this process's
    own, so that the forked job finds them computed (:func:`get_config`): reading them
    in each job (files, variables, every option's parser) touched and so copied about
    a hundred and fifty of the template's memory pages, a millisecond of a worker's
    start. When they cannot be computed alike here (a bad setting, whose error the job
    must report itself; a deprecated name, whose warning is the job's to show), the
    job computes them itself, as before."""
    global _current
    key = _fingerprint(environ, cwd)
    with _lock:
        if key not in _prepared:
            cfg: Config | None
            try:
                cfg = _compute({}, environ, cwd, quiet=True)
            except Exception:  # noqa: BLE001 - the job computes it and reports the error
                cfg = None
            if len(_prepared) > 64:
                _prepared.clear()
            _prepared[key] = cfg
        cfg = _prepared[key]
        _code_settings.clear()
        _current = cfg
        if cfg is not None:
            _apply(cfg)


def get_config() -> Config:
    """The effective settings of this process (computed once, then cached)."""
    global _current
    with _lock:
        if _current is None:
            _current = load(_code_settings)
        return _current


def init(**settings: Any) -> Config:
    """Set settings in code (they beat the environment and files) and return the
    effective configuration. ``fiber.init(backend="docker", image="myimg")``."""
    global _current
    with _lock:
        merged = dict(_code_settings)
        merged.update(settings)
        cfg = load(merged)  # validates before anything changes
        if "backend" in settings:
            _check_backend(cfg.values["backend"])
        _code_settings.clear()
        _code_settings.update(merged)
        if _current is not None and _current.values != cfg.values:
            registry.reset_instances()
        _current = cfg
        return cfg


def reset() -> None:
    """Forget the settings given in code; the others are read again when next needed
    (as uber/fiber's ``fiber.reset()``)."""
    global _current
    with _lock:
        _code_settings.clear()
        _current = None
        if "fiber.wire.shm" in sys.modules:  # as when nothing was read yet
            sys.modules["fiber.wire.shm"].enable(True)
