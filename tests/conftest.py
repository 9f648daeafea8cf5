"""Root test configuration: ``--backend NAME`` selects the backend the portable tests
run on, and starts (then stops) that backend's real engine.

A backend's engine is managed by ``tests/engines/<name>.py``, a module with
``start() -> dict[str, str]`` (brings the engine up, returns the FIBER_* settings the
tests need, e.g. the image) and ``stop()`` (tears everything down). The local backend
needs none.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ENGINES = Path(__file__).parent / "engines"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--backend", default="local",
                     help="fiber backend for tests/portable (starts its engine)")


def _engine_module(name: str):
    path = ENGINES / f"{name}.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location(f"fiber_test_engine_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def fiber_engine(request: pytest.FixtureRequest):
    """Start the selected backend's engine for the whole session and export its
    settings; stop it at the end (also when tests fail)."""
    name = request.config.getoption("--backend")
    module = _engine_module(name) if name != "local" else None
    saved = dict(os.environ)
    settings: dict[str, str] = {}
    if module is not None:
        settings = module.start()
    os.environ.update(settings)
    os.environ["FIBER_BACKEND"] = name
    try:
        yield {"backend": name, **settings}
    finally:
        _end_fiber_jobs()
        os.environ.clear()
        os.environ.update(saved)
        if module is not None:
            module.stop()


def _end_fiber_jobs() -> None:
    """End what the tests left running while the engine is still up (so nothing is
    polled or terminated against a stopped engine at exit)."""
    import fiber
    from fiber.backend import registry

    for child in fiber.active_children():
        try:
            child.terminate()
            child.join(30)
        except Exception:  # noqa: BLE001 - best effort; the engine's stop() checks leftovers
            pass
    registry.reset_instances()
