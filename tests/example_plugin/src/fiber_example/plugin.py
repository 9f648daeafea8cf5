"""The hooks fiber finds through the entry point ``example = "fiber_example.plugin"``:
the backend's name and its settings. Kept light: the backend module (and whatever
client library a real cluster needs) is imported only when the backend is used."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any

from fiber.backend import Backend, BackendFactory, ConfigOption, hookimpl


def _make_backend(options: Mapping[str, Any]) -> Backend:
    from fiber_example.backend import ExampleBackend

    return ExampleBackend(options)


@hookimpl
def fiber_backends() -> dict[str, BackendFactory]:
    return {"example": _make_backend}


@hookimpl
def fiber_config_options() -> list[ConfigOption]:
    spool = os.path.join(tempfile.gettempdir(), f"fiber-example-{os.getuid()}")
    return [
        ConfigOption("example_marker", str, "example-default",
                     "value put in each job's EXAMPLE_JOB_MARKER variable"),
        ConfigOption("example_spool", str, spool,
                     "directory where the example backend keeps its jobs"),
    ]
