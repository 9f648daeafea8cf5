"""Images made for a program: the contract behind ``fiber build`` and ``fiber run --build``.

A backend whose jobs run in container images declares the capability ``images``
(:data:`fiber.backend.CAPABILITIES`). A plugin that can make images declares an
:class:`ImageBuilder` by name in its :class:`~fiber.backend.Plugin`'s ``builders``
(a dotted path, imported when used, as a backend's). The CLI asks the builder for the
program's image (:class:`ImageRequest`), then runs the program in the image it returns
(:class:`BuiltImage`), and the program's children use that image too (the ``image``
setting in their environment).

What a builder does with the request is its own: read the directory's Dockerfile, or
make one for the launching Python's environment (the interpreter's version, the
distributions in ``packages`` and those the program imports), tag the image by a hash
of what went into it, and push it to ``registry``. A tag that already exists is not
built or pushed again. Its failures are :class:`~fiber.errors.ImageBuildError`, whose
message the user sees as is: a directory that does not exist, a build that failed
(the tail of its log), a registry that refused the push (the registry's words).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BuiltImage", "ImageBuilder", "ImageRequest"]


@dataclass(frozen=True)
class ImageRequest:
    """What the program's image must hold.

    ``directory``: the program's code directory, absolute; its ``Dockerfile``, if
    there is one, builds the image (with the directory as build context), else the
    builder makes the image from ``base`` and the launching environment.
    ``backend``: the backend the image is for. ``packages``: distributions (pip names)
    of the launching environment the image needs besides those the program imports
    (fiber-core and the backend's plugin). ``registry``: where to push
    (``host:port[/path]``), or None to keep the image on the builder's engine.
    ``base``: the image a generated image starts from, or None for the builder's
    default."""

    directory: str
    backend: str
    packages: tuple[str, ...] = ()
    registry: str | None = None
    base: str | None = None


@dataclass(frozen=True)
class BuiltImage:
    """The image a builder made or found: its ``reference`` (what jobs run), whether it
    was ``built`` now (False: the tag existed), how many layers it ``pushed`` and how
    many the registry had already (``layers_existing``), and in ``settings`` the
    settings (name to value) jobs running from the image need."""

    reference: str
    built: bool
    pushed: int = 0
    layers_existing: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)


class ImageBuilder(abc.ABC):
    """Makes the image of a program (see the module docstring). Created with the
    effective settings, as a backend is."""

    #: the name users select the builder by (the ``image_builder`` setting)
    name: str = ""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = options

    @abc.abstractmethod
    def build(self, request: ImageRequest, say: Callable[[str], None]) -> BuiltImage:
        """Make (or find) the image ``request`` describes and push it to its registry;
        ``say`` tells the user what is being done (one line each). Raise
        :class:`~fiber.errors.ImageBuildError` with a message that says what to do."""

    def close(self) -> None:
        """Release connections. The builder is not used afterwards."""
        return None
