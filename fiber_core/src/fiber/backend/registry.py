"""Finding backends: the pluggy plugin manager, entry-point discovery, the contract
check and the per-process cache of backend instances.

Loading the plugins imports each plugin's entry point, a :class:`~fiber.backend.Plugin`
declaration (which must import nothing heavy), and checks that each declares the
contract version this fiber-core implements. The declarations are read through
pluggy's hook calling (``pm.hook.fiber_plugin()``); a backend's dotted path is
imported, and so its cluster's client library, only when that backend is used."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import re
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from fiber.backend import hookspecs
from fiber.backend.base import Backend
from fiber.backend.images import ImageBuilder
from fiber.backend.options import ConfigOption
from fiber.backend.plugin import CONTRACT_VERSION, Plugin
from fiber.errors import BackendNotFoundError, PluginContractError

__all__ = ["BackendInfo", "BackendNotFoundError", "PluginContractError", "backends",
           "builders", "config_options", "get_backend", "get_builder", "install_hint", "plugin_manager",
           "plugins", "reset", "reset_instances"]

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

    def factory(self, options: Mapping[str, Any]) -> Backend:
        """Import the factory named by :attr:`path` and call it with ``options``."""
        module_name, _, attribute = self.path.partition(":")
        try:
            target: Any = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as exc:
            raise BackendNotFoundError(
                f"backend {self.name!r} of {self.package} {self.version} names "
                f"{self.path!r}, which cannot be loaded ({type(exc).__name__}: {exc}); "
                f"reinstall {self.package}") from exc
        instance: Backend = target(options)
        return instance


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_plugins: list[Plugin] | None = None
_backends: dict[str, BackendInfo] | None = None
_instances: dict[Hashable, Backend] = {}
# the version of each entry point's distribution, by id of its Plugin object
_versions: dict[int, str] = {}


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, with every ``fiber`` entry point loaded and
    checked (:func:`plugins`)."""
    global _manager, _plugins
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
            pm.add_hookspecs(hookspecs)
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            _check_hooks(pm)
            declared = pm.hook.fiber_plugin()
            for plugin in declared:
                check_contract(plugin)
            _versions.clear()
            for plugin, dist in pm.list_plugin_distinfo():
                _versions[id(plugin)] = dist.version
            _manager, _plugins = pm, list(declared)
        return _manager


def plugins() -> list[Plugin]:
    """The declarations of every installed plugin (fiber-core's own included), as
    pluggy's hook calling returned them."""
    plugin_manager()
    assert _plugins is not None
    return list(_plugins)


def _check_hooks(pm: pluggy.PluginManager) -> None:
    """Every entry point is a plugin of this contract: it implements ``fiber_plugin``
    and no hook the contract does not have (one written for an older fiber-core)."""
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}

    def where(plugin: object) -> tuple[str, str]:
        dist = dists.get(id(plugin))
        package = dist.project_name if dist is not None else repr(plugin)
        version = f" {dist.version}" if dist is not None else ""
        return f"the entry point {pm.get_name(plugin)!r} of {package}{version}", package

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        text, package = where(exc.plugin)
        raise PluginContractError(
            f"{text} implements a hook that fiber-core {_core_version()} does not have "
            f"({exc}): it was written for another version of fiber's plugin contract; "
            f"{_what_it_needs(package, None)}") from None
    implemented = {id(impl.plugin) for impl in pm.hook.fiber_plugin.get_hookimpls()}
    for plugin in pm.get_plugins():
        if id(plugin) not in implemented:
            text, package = where(plugin)
            raise PluginContractError(
                f"{text} names {plugin!r}, which declares no fiber plugin (an entry "
                f"point names a fiber.backend.Plugin object; this fiber-core implements "
                f"contract version {CONTRACT_VERSION}): reinstall {package} if its "
                f"installed metadata is older than its code; otherwise "
                f"{_what_it_needs(package, None)}")


def check_contract(plugin: Plugin) -> None:
    """Raise :class:`PluginContractError` unless ``plugin`` implements the contract
    version of this fiber-core, naming the fiber-core the plugin needs."""
    if plugin.contract == CONTRACT_VERSION:
        return
    raise PluginContractError(
        f"{plugin.package} {distribution_version(plugin.package)} implements version "
        f"{plugin.contract!r} of fiber's plugin contract, and this fiber-core "
        f"{_core_version()} implements version {CONTRACT_VERSION}: "
        f"{_what_it_needs(plugin.package, plugin.contract)}")


def _core_version() -> str:
    from fiber._version import __version__

    return __version__


def _what_it_needs(package: str, contract: object) -> str:
    """What to install: the fiber-core versions ``package`` pins in its metadata, else
    a fiber-core implementing ``contract``."""
    pins = []
    try:
        for requirement in importlib.metadata.requires(package) or ():
            name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
            if name.lower().replace("_", "-") == "fiber-core":
                pins.append(requirement.split(";")[0].strip())
    except importlib.metadata.PackageNotFoundError:
        pass
    if pins:
        return (f"install the fiber-core it needs ({', '.join(pins)}), or a version of "
                f"{package} made for fiber-core {_core_version()}")
    wanted = (f"a fiber-core whose fiber.backend.CONTRACT_VERSION is {contract!r}"
              if contract is not None else "the fiber-core it was made for")
    return (f"install {wanted}, or a version of {package} made for fiber-core "
            f"{_core_version()}")


def backends() -> dict[str, BackendInfo]:
    """Every installed backend by name."""
    global _backends
    with _lock:
        if _backends is None:
            found: dict[str, BackendInfo] = {}
            for plugin in plugins():
                version = _versions.get(id(plugin)) or distribution_version(plugin.package)
                for name, path in plugin.backends.items():
                    if name in found:
                        raise BackendNotFoundError(
                            f"backend {name!r} is provided twice, by {found[name].package} and "
                            f"by {plugin.package}: uninstall one of them"
                        )
                    found[name] = BackendInfo(name, path, plugin.package, version)
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
    module_name, _, attribute = info.path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise BackendNotFoundError(
            f"image builder {name!r} of {info.package} {info.version} names {info.path!r}, "
            f"which cannot be loaded ({type(exc).__name__}: {exc}); reinstall "
            f"{info.package}") from exc
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
    global _manager, _plugins, _backends
    with _lock:
        reset_instances()
        _manager = None
        _plugins = None
        _backends = None


def distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "?"
