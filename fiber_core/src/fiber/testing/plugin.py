"""fiber's pytest plugin: run fiber's own backend suite against any backend.

``pytest --fiber-backend NAME`` adds :mod:`fiber.testing.suite` to the tests pytest
collects: the backend contract (:mod:`fiber.testing.contract`, run on NAME's backend)
and the portable tests that prove ``Process``, ``Queue``, ``Pipe``, ``Pool``,
``Manager``, shared state and ``Ring`` on it. Every test of the session then runs with
``FIBER_BACKEND=NAME`` and the settings of the test cluster. The plugin is registered
through the ``pytest11`` entry point of fiber-core, so it is there wherever fiber is
installed and does nothing until ``--fiber-backend`` is given (``-p no:fiber`` turns
it off; ``--fiber-no-suite`` keeps the backend but runs only the tests named).

The backend's author starts and stops the test cluster in a session fixture named
``fiber_cluster``, defined in the ``conftest.py`` at the root of their tests (pytest's
rootdir, so that it also reaches the suite's tests) or in a plugin of theirs. It yields
the settings the jobs need, as environment variables::

    @pytest.fixture(scope="session")
    def fiber_cluster(fiber_backend_name):
        cluster = start_my_test_cluster()         # whatever brings it up
        yield {"FIBER_MYCLUSTER_URL": cluster.url}
        cluster.stop()

The default starts nothing and yields no settings (a cluster that is already there).
Which optional parts of the contract the suite tests follows the backend's
``capabilities``; the others are skipped, and the skip names the capability.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

__all__ = ["SUITE"]

#: the directory of the shipped suite
SUITE = Path(__file__).parent / "suite"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fiber", "fiber backends")
    group.addoption(
        "--fiber-backend", metavar="NAME", default=None,
        help="run fiber's backend suite (the contract and the portable Process, Queue, "
             "Pipe, Pool and Manager tests) against the fiber backend NAME; every test "
             "of the session runs with FIBER_BACKEND=NAME on the cluster that the "
             "`fiber_cluster` fixture starts")
    group.addoption(
        "--fiber-no-suite", action="store_true", default=False,
        help="with --fiber-backend: run only the tests named, not fiber's backend suite")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    _check_backend(config.getoption("fiber_backend"))
    if not config.pluginmanager.hasplugin("timeout"):  # pytest-timeout's, for the suite
        config.addinivalue_line("markers", "timeout(seconds): a time limit of the test")
    if (config.getoption("fiber_backend") and not config.getoption("fiber_no_suite")
            and str(SUITE) not in config.args):
        config.args.append(str(SUITE))


def _check_backend(name: str | None) -> None:
    """A ``--fiber-backend`` that names no installed backend, or one that cannot be
    used (its plugin broken, its class path not resolving, its class not implementing
    the contract), is a usage error, said once before any test runs, with the
    installed backends and how to get the one named, or with the fault."""
    if not name:
        return
    from fiber.backend import registry  # only when asked: plain pytest runs stay light

    installed = registry.backends()
    fault = registry.backend_fault(name)
    if fault is not None:
        raise pytest.UsageError(f"--fiber-backend {name}: {fault}")
    if name not in installed:
        raise pytest.UsageError(
            f"--fiber-backend {name}: no installed fiber backend is named {name!r} "
            f"(installed: {', '.join(sorted(installed))}); "
            f"{registry.install_hint(name)}")


@pytest.fixture(scope="session")
def fiber_backend_name(request: pytest.FixtureRequest) -> str:
    """The backend under test: ``--fiber-backend``, else ``local``."""
    name = request.config.getoption("fiber_backend")
    return str(name) if name else "local"


@pytest.fixture(scope="session")
def fiber_cluster(fiber_backend_name: str) -> Iterator[Mapping[str, str]]:
    """The test cluster's settings (override it to start and stop one)."""
    yield {}


@pytest.fixture(scope="session")
def fiber_backend(fiber_backend_name: str,
                  fiber_cluster: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """The session's backend: ``{"backend": NAME, **settings of the cluster}``, exported
    to the environment for the whole session; the jobs the tests left are ended while
    the cluster is still up, and the environment is restored at the end."""
    saved = dict(os.environ)
    os.environ.update(fiber_cluster)
    os.environ["FIBER_BACKEND"] = fiber_backend_name
    try:
        yield {"backend": fiber_backend_name, **fiber_cluster}
    finally:
        _end_fiber_jobs()
        os.environ.clear()
        os.environ.update(saved)


def _end_fiber_jobs() -> None:
    """End what the tests left running while the cluster is still up (so nothing is
    polled or terminated against a stopped cluster at exit), and wait until the
    backend has freed every job of the session (what the cluster keeps of an ended job
    is freed once its final status is seen), so that the cluster's own check for
    leftovers, in ``fiber_cluster``, sees only what fiber really left."""
    from fiber.backend import registry
    from fiber.process import active_children
    from fiber.runtime.teardown import release_all

    for child in active_children():
        try:
            child.terminate()
            child.join(30)
        except Exception:  # noqa: BLE001 - best effort; the cluster's own checks see leftovers
            pass
    release_all()
    registry.reset_instances()
