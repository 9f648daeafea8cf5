"""The plugin's declaration, which fiber finds through the entry point
``example = "fiber_example.plugin:plugin"``: the backend's name with the dotted path of
its class, and its settings. Kept light: fiber imports the backend module (and
whatever client library a real cluster needs) from that path only when the backend is
used."""

from __future__ import annotations

import os
import tempfile

from fiber.backend import ConfigOption, Plugin

_SPOOL = os.path.join(tempfile.gettempdir(), f"fiber-example-{os.getuid()}")

plugin = Plugin(
    package="fiber-example-backend",
    contract=1,  # the version of fiber's plugin contract this package implements
    backends={"example": "fiber_example.backend:ExampleBackend"},
    options=[
        ConfigOption("example_marker", str, "example-default",
                     "value put in each job's EXAMPLE_JOB_MARKER variable"),
        ConfigOption("example_spool", str, _SPOOL,
                     "directory where the example backend keeps its jobs"),
    ],
)
