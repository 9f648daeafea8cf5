"""Loading the plugins' entry points one at a time, so that a broken one breaks only
itself.

Each entry point of the group ``fiber`` is imported, registered with the plugin
manager and its declaration (:class:`~fiber.backend.Plugin`) read and checked on its
own: one whose module cannot be imported, whose attribute is missing, which declares
no plugin, implements hooks this contract does not have, or declares another contract
version is set aside as a :class:`BrokenPlugin` that names its distribution, its entry
point and the fault, and the others load as if it were not there. The registry
(:mod:`fiber.backend.registry`) warns once per broken plugin, lists it (``fiber
backends``) and raises its fault when one of its backends is selected.

:func:`class_fault` checks a backend's class against the contract (the required
methods, ``secrets_delivery``) when the backend is resolved, which is when its module
is imported (declarations stay light: see :mod:`fiber.backend.plugin`).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pluggy

from fiber.backend.base import REQUIRED, Backend
from fiber.backend.plugin import CONTRACT_VERSION, Plugin

__all__ = ["BrokenPlugin", "LoadedPlugin", "class_fault", "load_entry_points",
           "resolve_path"]


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed plugin fiber has set aside: its distribution ``package`` and
    ``version``, its entry point (``entry_point`` = ``target``), the ``fault`` (what
    is wrong and what to change) and the ``backends`` it provides (its declaration's
    names when it could be read, else the entry point's name). A backend name that
    several plugins claim is one too, without an entry point, under the first
    plugin's name."""

    package: str
    version: str
    entry_point: str
    target: str
    fault: str
    backends: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        """One sentence: which plugin, through which entry point, and its fault (a
        backend name several plugins claim, which has no entry point: the fault)."""
        if not self.entry_point:
            return self.fault
        return (f"the fiber plugin {self.package} {self.version} (entry point "
                f"{self.entry_point!r} = {self.target!r}) is not used: {self.fault}")


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin that loaded: the object its entry point names (registered with the
    plugin manager), its declaration, and its distribution."""

    obj: object
    declaration: Plugin
    package: str
    version: str


def _entry_points(group: str) -> Iterator[tuple[importlib.metadata.EntryPoint, str, str]]:
    """Each entry point of ``group`` with its distribution's name and version, the
    first of each name only (as pluggy's ``load_setuptools_entrypoints``)."""
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group != group or ep.name in seen:
                continue
            seen.add(ep.name)
            yield ep, dist.metadata["name"] or "?", dist.version or "?"


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def resolve_path(path: str) -> tuple[Any, str | None]:
    """The object named by ``"module:attribute"`` (the module itself when the
    attribute is empty), or ``(None, fault)``: the module
    does not exist, importing it raised (what, and where), or it has no such
    attribute (with the closest names it has)."""
    module_name, _, attribute = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            return None, f"there is no module {missing!r} to import"
        return None, (f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
                      f"{_where(exc)} (a package it needs is not installed)")
    except Exception as exc:  # noqa: BLE001 - any fault of a plugin's module is its own
        return None, (f"importing {module_name!r} raised {type(exc).__name__}: {exc}"
                      f"{_where(exc)}")
    owner = module_name
    for part in filter(None, attribute.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            names = [n for n in dir(target) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=1)
            mean = f" (did you mean {close[0]!r}?)" if close else ""
            return None, f"{owner!r} has no attribute {part!r}{mean}"
        except Exception as exc:  # noqa: BLE001 - a module __getattr__ of the plugin's
            return None, (f"getting {part!r} of {owner!r} raised "
                          f"{type(exc).__name__}: {exc}{_where(exc)}")
        owner = f"{owner}.{part}"
    return target, None


def _contract_fault(declared: object, pins: list[str]) -> str:
    """What a contract mismatch is, and what to change on which side."""
    from fiber._version import __version__

    pinned = (f"; {', '.join(pins)} is what its metadata requires, and fiber-core "
              f"{__version__} is installed" if pins else "")
    return (f"it declares contract={declared!r} in its Plugin, and this fiber-core "
            f"{__version__} speaks contract version {CONTRACT_VERSION} only{pinned}. "
            f"If the plugin was written for contract {CONTRACT_VERSION}, its author "
            f"changes its declaration to contract={CONTRACT_VERSION}; otherwise install "
            f"a fiber-core that speaks contract {declared!r} (a fiber-core whose "
            f"fiber.backend.CONTRACT_VERSION is {declared!r}), or a version of the "
            f"plugin made for contract {CONTRACT_VERSION}")


def core_pins(package: str) -> list[str]:
    """The fiber-core requirements of ``package``'s installed metadata."""
    pins = []
    try:
        for requirement in importlib.metadata.requires(package) or ():
            name = re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]
            if name.lower().replace("_", "-") == "fiber-core":
                pins.append(requirement.split(";")[0].strip())
    except importlib.metadata.PackageNotFoundError:
        pass
    return pins


def _declaration_fault(declared: object) -> str | None:
    if not isinstance(declared, Plugin):
        return (f"its fiber_plugin hook returned {declared!r}, not a "
                f"fiber.backend.Plugin")
    for name in declared.backends:
        if not isinstance(name, str) or not name:
            return f"it declares a backend named {name!r} (a name is a non-empty string)"
    return None


def load_entry_points(pm: pluggy.PluginManager, group: str
                      ) -> tuple[list[LoadedPlugin], list[BrokenPlugin]]:
    """Load every entry point of ``group`` into ``pm``, each on its own: those that
    load and declare a plugin of this contract, and those set aside with their fault
    (unregistered again, so that the hook calls never reach them)."""
    loaded: list[LoadedPlugin] = []
    broken: list[BrokenPlugin] = []
    for ep, package, version in _entry_points(group):
        if pm.is_blocked(ep.name) or pm.get_plugin(ep.name) is not None:
            continue

        def refuse(fault: str, backends: tuple[str, ...] = (ep.name,),
                   package: str = package, version: str = version,
                   ep: importlib.metadata.EntryPoint = ep) -> None:
            broken.append(BrokenPlugin(package, version, ep.name, ep.value, fault,
                                       backends))

        obj, fault = resolve_path(f"{ep.module}:{ep.attr or ''}")
        if fault is not None:
            refuse(f"its entry point does not resolve: {fault}; the entry point is "
                   f"declared in {package}'s packaging metadata ([project.entry-points."
                   f"{group}] of its pyproject.toml), and names the module:attribute "
                   f"of the package's Plugin object")
            continue
        try:
            pm.register(obj, name=ep.name)
        except Exception as exc:  # noqa: BLE001 - pluggy's validation of its hooks
            refuse(f"pluggy refuses its hooks ({type(exc).__name__}: {exc})")
            continue
        foreign = sorted(caller.name for caller in pm.get_hookcallers(obj) or ()
                         if caller.spec is None)
        impls = [impl for impl in pm.hook.fiber_plugin.get_hookimpls() if impl.plugin is obj]
        if foreign or not impls:
            pm.unregister(obj)
            what = (f"implements hooks fiber-core does not have ({', '.join(foreign)}): "
                    f"it was written for another version of fiber's plugin contract"
                    if foreign else
                    f"names {obj!r}, which is not a fiber.backend.Plugin (an entry point "
                    f"names the package's Plugin object)")
            pins = core_pins(package)
            refuse(f"the entry point {what}; this fiber-core speaks contract version "
                   f"{CONTRACT_VERSION}" + (f", and {package} requires {', '.join(pins)}"
                                            if pins else ""))
            continue
        try:
            declared = impls[0].function()
        except Exception as exc:  # noqa: BLE001 - a plugin's own hook
            pm.unregister(obj)
            refuse(f"its fiber_plugin hook raised {type(exc).__name__}: {exc}{_where(exc)}")
            continue
        fault = _declaration_fault(declared)
        if fault is not None or not isinstance(declared, Plugin):
            pm.unregister(obj)
            refuse(fault or "")
            continue
        if declared.contract != CONTRACT_VERSION:
            pm.unregister(obj)
            refuse(_contract_fault(declared.contract, core_pins(package)),
                   tuple(declared.backends) or (ep.name,))
            continue
        loaded.append(LoadedPlugin(obj, declared, package, version))
    return loaded, broken


def class_fault(target: Any) -> str | None:
    """What keeps ``target``, the factory a backend's dotted path names, from being a
    backend of this contract, or None: a class that is not a
    :class:`~fiber.backend.Backend`, one that leaves required methods unimplemented
    (named), one without ``secrets_delivery``. A factory that is not a class is
    checked on the instance it returns."""
    if isinstance(target, type):
        if not issubclass(target, Backend):
            return (f"{target.__module__}.{target.__qualname__} does not subclass "
                    f"fiber.backend.Backend")
        missing = sorted(getattr(target, "__abstractmethods__", ()))
        if missing:
            return (f"{target.__qualname__} does not implement the required "
                    f"method{'s' if len(missing) > 1 else ''} {', '.join(missing)} of "
                    f"fiber.backend.Backend (required: {', '.join(REQUIRED)})")
    elif not callable(target):
        return f"it names {target!r}, which is neither a Backend class nor a factory"
    else:
        return None
    return instance_fault(target)


def instance_fault(backend: Any) -> str | None:
    """What keeps ``backend`` (a Backend class or instance) from running fiber's
    processes, or None."""
    if not isinstance(backend, type) and not isinstance(backend, Backend):
        return (f"its factory returned {type(backend).__qualname__}, not a "
                f"fiber.backend.Backend")
    if getattr(backend, "secrets_delivery", None) not in ("private", "env"):
        name = backend.__qualname__ if isinstance(backend, type) else type(backend).__qualname__
        return (f"{name}.secrets_delivery is {getattr(backend, 'secrets_delivery', None)!r}; "
                f"it is required, 'private' (the backend delivers JobSpec.secrets "
                f"itself) or 'env' (the core puts them in the job's environment): "
                f"see fiber.backend.secrets")
    return None
