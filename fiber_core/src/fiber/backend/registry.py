"""Finding backends: the pluggy plugin manager, entry-point discovery, the contract
check and the per-process cache of backend instances.

Loading the plugins imports each plugin's entry point, a :class:`~fiber.backend.Plugin`
declaration (which must import nothing heavy), and checks that each declares the
contract version this fiber-core implements (:mod:`fiber.backend.discovery`, one entry
point at a time). A plugin that cannot be loaded or declared is set aside with one
warning naming its distribution, its entry point and its fault; every other backend
works as before, ``fiber backends`` lists it as broken, and selecting one of its
backends raises :class:`PluginContractError` with that fault. The declarations are
read through pluggy's hook calling (``pm.hook.fiber_plugin()``); a backend's dotted
path is imported, and so its cluster's client library, only when that backend is
used, and its class is then checked against the contract (the required methods,
``secrets_delivery``) before it is instantiated."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from fiber.backend import hookspecs
from fiber.backend.base import Backend
from fiber.backend.discovery import (
    BrokenPlugin,
    class_fault,
    instance_fault,
    load_entry_points,
    resolve_path,
)
from fiber.backend.images import ImageBuilder
from fiber.backend.options import ConfigOption
from fiber.backend.plugin import Plugin
from fiber.errors import BackendNotFoundError, PluginContractError

__all__ = ["BackendInfo", "BackendNotFoundError", "BrokenPlugin", "PluginContractError",
           "backend_fault", "backends", "broken", "broken_backend", "builders",
           "config_options", "get_backend", "get_builder", "install_hint", "not_found",
           "plugin_manager", "plugins", "quiet_in_jobs", "reset", "reset_instances"]

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
    """An installed backend: its ``name``, the dotted ``path`` of its factory and the
    ``package`` (with its ``version``) that declares it."""

    name: str
    path: str
    package: str
    version: str

    def resolve(self) -> Any:
        """The factory named by :attr:`path`, checked against the contract; raises
        :class:`PluginContractError` naming the plugin, the path and the fault (a
        path that does not resolve, a class missing required methods...)."""
        target, fault = resolve_path(self.path)
        if fault is None:
            fault = class_fault(target)
        if fault is not None:
            raise PluginContractError(self.fault_message(fault))
        return target

    def fault_message(self, fault: str) -> str:
        """The error of a backend of this plugin that cannot be used, for ``fault``."""
        return (f"the fiber backend {self.name!r} of {self.package} {self.version} "
                f"cannot be used: its Plugin declares {self.name!r}: {self.path!r}, and "
                f"{fault}. Fix the backend or the path in {self.package}'s Plugin "
                f"declaration ('module:attribute' of its Backend class)")

    def factory(self, options: Mapping[str, Any]) -> Backend:
        """Import the factory named by :attr:`path`, check it and call it with
        ``options``."""
        instance: Backend = self.resolve()(options)
        fault = instance_fault(instance)
        if fault is not None:
            raise PluginContractError(self.fault_message(fault))
        return instance


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_plugins: list[Plugin] | None = None
_backends: dict[str, BackendInfo] | None = None
_broken: list[BrokenPlugin] = []
_instances: dict[Hashable, Backend] = {}
# the distribution (name, version) of each entry point, by id of its Plugin object
_versions: dict[int, str] = {}
# whether this process warns of the plugins it sets aside (a job does not: its
# program's main process has warned)
_warn = True


def quiet_in_jobs() -> None:
    """This process is a job (or a forkserver) of a program whose main process
    warns of broken plugins: log them at debug level here, not once per job."""
    global _warn
    _warn = False


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every ``fiber`` entry point that loads
    and declares a plugin of this contract registered (:func:`plugins`); the others
    are set aside (:func:`broken`), each with one warning."""
    global _manager, _plugins
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
            pm.add_hookspecs(hookspecs)
            loaded, broken_ones = load_entry_points(pm, ENTRY_POINT_GROUP)
            for one in broken_ones:
                logger.log(logging.WARNING if _warn else logging.DEBUG, "%s",
                           one.describe())
            _versions.clear()
            for plugin in loaded:
                _versions[id(plugin.obj)] = plugin.version
            declared = pm.hook.fiber_plugin()
            _broken[:] = broken_ones
            _manager, _plugins = pm, list(declared)
        return _manager


def plugins() -> list[Plugin]:
    """The declarations of every installed plugin that loaded (fiber-core's own
    included), as pluggy's hook calling returned them."""
    plugin_manager()
    assert _plugins is not None
    return list(_plugins)


def broken() -> list[BrokenPlugin]:
    """The installed plugins set aside, each with its fault (a backend name two
    plugins claim counts as broken too)."""
    backends()
    return list(_broken)


def broken_backend(name: str) -> BrokenPlugin | None:
    """The broken plugin that provides (or, not loaded, may provide) the backend
    ``name``: its declaration names it, or (not read) its entry point is so named or
    its package is the one known to provide it (``fiber-k8s`` for ``k8s``)."""
    for item in broken():
        if name in item.backends or (item.entry_point and item.package
                                     == KNOWN_BACKEND_PACKAGES.get(name)):
            return item
    return None


def backend_fault(name: str) -> str | None:
    """Why the installed backend ``name`` cannot be used, or None: its plugin is
    broken, or (importing its module, which its first use would do) its dotted path
    does not resolve or its class does not implement the contract. What ``fiber
    backends`` and ``pytest --fiber-backend`` check."""
    item = broken_backend(name)
    if item is not None:
        return f"the fiber backend {name!r} cannot be used: {item.describe()}"
    info = backends().get(name)
    if info is None:
        return None
    try:
        info.resolve()
    except PluginContractError as exc:
        return str(exc)
    return None


def backends() -> dict[str, BackendInfo]:
    """Every installed backend by name (of the plugins that loaded; a name two
    plugins claim is set aside, as :func:`broken`, naming both)."""
    global _backends
    with _lock:
        if _backends is None:
            found: dict[str, BackendInfo] = {}
            twice: dict[str, list[BackendInfo]] = {}
            for plugin in plugins():
                version = _versions.get(id(plugin)) or distribution_version(plugin.package)
                for name, path in plugin.backends.items():
                    info = BackendInfo(name, path, plugin.package, version)
                    if name in found or name in twice:
                        twice.setdefault(name, [found.pop(name)] if name in found else [])
                        twice[name].append(info)
                    else:
                        found[name] = info
            for name, infos in twice.items():
                infos.sort(key=lambda info: info.package)
                _broken.append(BrokenPlugin(
                    infos[0].package, infos[0].version, "", "",
                    f"the fiber backend name {name!r} is provided by " + " and by ".join(
                        f"{i.package} {i.version} ({i.path})" for i in infos)
                    + ": uninstall all but one of them", (name,)))
                logger.log(logging.WARNING if _warn else logging.DEBUG, "%s",
                           _broken[-1].describe())
            _backends = found
        return _backends


def builders() -> dict[str, BackendInfo]:
    """Every installed image builder by name (:class:`BackendInfo` describes it as it
    does a backend: its name, dotted path and package)."""
    found: dict[str, BackendInfo] = {}
    for plugin in plugins():
        version = _versions.get(id(plugin)) or distribution_version(plugin.package)
        for name, path in plugin.builders.items():
            if name in found:
                raise BackendNotFoundError(
                    f"image builder {name!r} is provided twice, by {found[name].package} "
                    f"and by {plugin.package}: uninstall one of them")
            found[name] = BackendInfo(name, path, plugin.package, version)
    return found


def get_builder(name: str | None, options: Mapping[str, Any]) -> ImageBuilder:
    """A new image builder: the one called ``name``, or with None the only one
    installed; created with the effective settings ``options``. The caller closes it."""
    found = builders()
    if name is None:
        if len(found) != 1:
            raise BackendNotFoundError(
                "no image builder is installed: install the fiber-docker plugin, which "
                "builds images with a Docker engine (`pip install ./plugins/fiber-docker` "
                "from a clone of fiber's repository)" if not found else
                f"several image builders are installed ({', '.join(sorted(found))}): "
                "choose one with the image_builder setting (FIBER_IMAGE_BUILDER)")
        name = next(iter(found))
    info = found.get(name)
    if info is None:
        raise BackendNotFoundError(
            f"no installed plugin provides the image builder {name!r} (image_builder "
            f"setting; installed builders: {', '.join(sorted(found)) or 'none'})")
    target, fault = resolve_path(info.path)
    if fault is not None:
        raise BackendNotFoundError(
            f"image builder {name!r} of {info.package} {info.version} names the class "
            f"{info.path!r}, which does not resolve: {fault}")
    builder: ImageBuilder = target(options)
    if not getattr(builder, "name", ""):
        builder.name = name
    return builder


def config_options() -> list[ConfigOption]:
    """The settings declared by every installed plugin (the core's included)."""
    return [option for plugin in plugins() for option in plugin.options]


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
            raise not_found(name)
        instance = info.factory(options)
        if not getattr(instance, "name", ""):
            instance.name = name
        _instances[key] = instance
        logger.debug("backend %s created from %s %s", name, info.package, info.version)
        return instance


def not_found(name: str, prefix: str = "") -> BackendNotFoundError:
    """The error of selecting ``name``, which is not an installed backend: the fault
    of the broken plugin that provides it, else the installed backends (and the
    broken plugins, whose backends' names may be unknown) and how to get it."""
    fault = backend_fault(name) if broken_backend(name) is not None else None
    if fault is not None:
        return PluginContractError(prefix + fault)
    installed = ", ".join(sorted(backends())) or "none"
    unknown = [b for b in broken() if len(b.backends) == 1 and b.backends[0] == b.entry_point]
    also = "".join(f"; {b.describe()}" for b in unknown)
    return BackendNotFoundError(
        f"{prefix}no installed plugin provides the fiber backend {name!r} "
        f"(installed backends: {installed}); {install_hint(name)}{also}")


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
    global _manager, _plugins, _backends
    with _lock:
        reset_instances()
        _manager = None
        _plugins = None
        _backends = None
        _broken.clear()


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"
