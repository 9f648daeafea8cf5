"""Finding backends: the pluggy plugin manager, entry-point discovery and the
per-process cache of backend instances.

Loading the plugins imports each plugin's entry-point module (which declares its
settings and backends and should import nothing heavy); a backend's factory, and so
its cluster's client library, runs only when that backend is used."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pluggy

from fiber.backend import hookspecs
from fiber.backend.base import Backend
from fiber.backend.options import ConfigOption
from fiber.errors import BackendNotFoundError

__all__ = ["BackendInfo", "BackendNotFoundError", "backends", "config_options",
           "get_backend", "install_hint", "plugin_manager", "reset", "reset_instances"]

logger = logging.getLogger("fiber")

ENTRY_POINT_GROUP = "fiber"

# For the error message only: which pip package provides a backend that is not
# installed (the fsspec way of saying "install X to use Y"). Each is built from
# plugins/<package> of fiber's repository; the packages are not on PyPI yet.
KNOWN_BACKEND_PACKAGES = {
    "docker": "fiber-docker",
    "ssh": "fiber-ssh",
    "slurm": "fiber-slurm",
    "kubernetes": "fiber-k8s",
    "k8s": "fiber-k8s",
}


@dataclass(frozen=True)
class BackendInfo:
    name: str
    factory: hookspecs.BackendFactory
    package: str
    version: str


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_backends: dict[str, BackendInfo] | None = None
_instances: dict[Hashable, Backend] = {}


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every ``fiber`` entry point loaded."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
            pm.add_hookspecs(hookspecs)
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            _manager = pm
        return _manager


def _package_of(plugin: object) -> tuple[str, str]:
    pm = plugin_manager()
    for plug, dist in pm.list_plugin_distinfo():
        if plug is plugin:
            return dist.project_name, dist.version
    return getattr(plugin, "__name__", repr(plugin)), "?"


def backends() -> dict[str, BackendInfo]:
    """Every installed backend by name."""
    global _backends
    with _lock:
        if _backends is None:
            found: dict[str, BackendInfo] = {}
            pm = plugin_manager()
            for impl in pm.hook.fiber_backends.get_hookimpls():
                package, version = _package_of(impl.plugin)
                # the hookspec's return type (pluggy types an implementation's as object)
                provided = cast("Mapping[str, hookspecs.BackendFactory] | None",
                                impl.function()) or {}
                for name, factory in provided.items():
                    if name in found:
                        raise BackendNotFoundError(
                            f"backend {name!r} is provided twice, by {found[name].package} and "
                            f"by {package}: uninstall one of them"
                        )
                    found[name] = BackendInfo(name, factory, package, version)
            _backends = found
        return _backends


def config_options() -> list[ConfigOption]:
    """The settings declared by every installed plugin (the core's included)."""
    options: list[ConfigOption] = []
    for group in plugin_manager().hook.fiber_config_options():
        options.extend(group or ())
    return options


def get_backend(name: str, options: Mapping[str, Any],
                variant: Hashable | None = None) -> Backend:
    """The backend instance named ``name`` for this process, created on first use
    with the effective settings ``options``; ``variant`` (a context's setting
    overrides) selects an instance of its own."""
    key: Hashable = name if variant is None else (name, variant)
    with _lock:
        instance = _instances.get(key)
        if instance is not None:
            return instance
        info = backends().get(name)
        if info is None:
            installed = ", ".join(sorted(backends())) or "none"
            hint = install_hint(name)
            raise BackendNotFoundError(
                f"no installed plugin provides the fiber backend {name!r} "
                f"(installed backends: {installed}); {hint}"
            )
        instance = info.factory(options)
        if not getattr(instance, "name", ""):
            instance.name = name
        _instances[key] = instance
        logger.debug("backend %s created from %s %s", name, info.package, info.version)
        return instance


def install_hint(name: str) -> str:
    """What to do to get the backend ``name``: the commands that install its package
    today (from a clone of fiber's repository) and once it is on PyPI."""
    package = KNOWN_BACKEND_PACKAGES.get(name)
    if package is None:
        hint = "install the plugin package that provides it"
        if len(name) >= 2 and name[0] == name[-1] and name[0] in "'\"":
            hint += f" (or drop the quotes: {name[1:-1]!r})"
        return hint
    return (f"install it from a clone of fiber's repository with "
            f"`pip install ./plugins/{package}` (or from a wheel built there with "
            f"`python -m build plugins/{package}`); once {package} is on PyPI, "
            f"`pip install {package}`")


def reset_instances() -> None:
    """Close and forget the backend instances (settings changed)."""
    with _lock:
        for instance in _instances.values():
            try:
                instance.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                logger.debug("closing backend %s failed", instance.name, exc_info=True)
        _instances.clear()


def reset() -> None:
    """Forget discovered plugins and backend instances (for tests)."""
    global _manager, _backends
    with _lock:
        reset_instances()
        _manager = None
        _backends = None


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"
