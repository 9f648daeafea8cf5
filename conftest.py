"""The project's test clusters for fiber's pytest plugin (:mod:`fiber.testing.plugin`):
``pytest --fiber-backend NAME`` starts NAME's real engine through
``tests/engines/<name>.py`` (a module with ``start() -> dict[str, str]``, which brings
the engine up and returns the FIBER_* settings the tests need, and ``stop()``, which
tears everything down) and stops it at the end of the session, also when tests fail.
The local backend needs none. It lives at the repository's root (pytest's rootdir) so
that the shipped suite's tests see it too."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ENGINES = Path(__file__).parent / "tests" / "engines"


def _engine_module(name: str) -> ModuleType | None:
    path = ENGINES / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"fiber_test_engine_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # known by that name, so the tests that act on the engine (a restart) find the
    # instance that started it and holds its state
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def fiber_cluster(fiber_backend_name: str) -> Iterator[dict[str, str]]:
    module = _engine_module(fiber_backend_name) if fiber_backend_name != "local" else None
    if module is None:
        yield {}
        return
    settings = module.start()
    try:
        yield settings
    finally:
        # the plugin's fiber_backend (which depends on this fixture) has already
        # ended the jobs the tests left, while the engine was up
        module.stop()
