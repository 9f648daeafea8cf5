"""What a plugin declares, as data: :class:`Plugin` and the contract version.

A plugin's entry point (group ``fiber``) names one :class:`Plugin` object, for example
``slurm = "fiber_slurm.plugin:plugin"``::

    plugin = Plugin(
        package="fiber-slurm",
        contract=1,
        backends={"slurm": "fiber_slurm.backend:SlurmBackend"},
        options=OPTIONS,
    )

``backends`` maps each backend's name to the dotted path of its factory (usually the
:class:`~fiber.backend.Backend` subclass), ``module:attribute``; ``builders``, optional,
does the same for image builders (:class:`fiber.backend.images.ImageBuilder`, what
``fiber build`` uses). The registry
(:mod:`fiber.backend.registry`) imports that module only when the backend is used, so
the module holding the declaration stays light without any loader of its own.
``contract`` is the version of this contract the plugin was written for: write the
number itself, never ``CONTRACT_VERSION`` (which would always agree); the registry
sets aside a plugin that declares another version than this fiber-core implements
(:mod:`fiber.backend.discovery`: one warning naming both versions and what to change
on which side; the other plugins work, and selecting one of its backends raises that
fault).

The object implements the hook of :mod:`fiber.backend.hookspecs`
(``fiber_plugin``), which the registry calls through pluggy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

import pluggy

from fiber.backend.options import ConfigOption

__all__ = ["CONTRACT_VERSION", "PROJECT_NAME", "Plugin", "hookimpl"]

#: pluggy's project name of fiber's hooks
PROJECT_NAME = "fiber"
#: decorator for a plugin's hook implementations (:class:`Plugin` has the one there is)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: The version of the plugin contract this fiber-core implements: the names
#: :mod:`fiber.backend` exports, their signatures and meaning. It changes when a plugin
#: written for the previous version would no longer work (a hook, a method or a field
#: removed or changed), and with it the minor version of fiber-core (0.1 -> 0.2).
CONTRACT_VERSION = 1


class Plugin:
    """A plugin's declaration: its distribution ``package`` (the name pip knows, for
    messages), the ``contract`` version it implements, its ``backends`` (name to
    ``"module:attribute"`` of the factory), its settings (``options``) and its image
    ``builders`` (name to ``"module:attribute"``, optional)."""

    def __init__(self, *, package: str, contract: int, backends: Mapping[str, str],
                 options: Sequence[ConfigOption] = (),
                 builders: Mapping[str, str] | None = None) -> None:
        for name, path in [*backends.items(), *(builders or {}).items()]:
            module, sep, attribute = path.partition(":")
            if not (module and sep and attribute):
                raise ValueError(
                    f"backend {name!r} of {package}: {path!r} is not a dotted path "
                    "'package.module:Attribute'")
        self.package = package
        self.contract = contract
        self.backends: Mapping[str, str] = MappingProxyType(dict(backends))
        self.options: tuple[ConfigOption, ...] = tuple(options)
        self.builders: Mapping[str, str] = MappingProxyType(dict(builders or {}))

    def __repr__(self) -> str:
        return (f"Plugin(package={self.package!r}, contract={self.contract!r}, "
                f"backends={dict(self.backends)!r})")

    @hookimpl
    def fiber_plugin(self) -> Plugin:
        return self
