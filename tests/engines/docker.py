"""The docker backend's test engine for ``pytest --fiber-backend docker``: a private dockerd
and a test image holding this Python and its virtual environment (see
scripts/engines/docker/engine.py). The editable installs' sources are mounted
read-only into every container through ``FIBER_DOCKER_VOLUMES``."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "engines" / "docker" / "engine.py"
_state: dict | None = None


def _engine():
    spec = importlib.util.spec_from_file_location("fiber_docker_test_engine", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def start() -> dict[str, str]:
    """Bring the engine up and build (or reuse) the image; return FIBER_* settings."""
    global _state
    logging.getLogger("fiber.docker").info("starting the docker test engine")
    settings, _state = _engine().start(sys.executable)
    return settings


def stop() -> None:
    """Remove every fiber container, stop dockerd, remove temporary files; raise if the
    tests left containers behind."""
    global _state
    state, _state = _state, None
    if state is not None:
        _engine().stop(state)


def manager_pids() -> list[int]:
    """dockerd's pid, from the pidfile next to the socket of ``FIBER_DOCKER_HOST``."""
    socket = os.environ["FIBER_DOCKER_HOST"].removeprefix("unix://")
    return [int((Path(socket).parent / "docker.pid").read_text())]


# -- an outage of the cluster manager (the fault tests and bench/faults.py) -----------
def freeze() -> None:
    """Take the cluster manager away: SIGSTOP dockerd (found from the settings in the
    environment, so any process of the session may call it). ``thaw()`` brings it back."""
    for pid in manager_pids():
        os.kill(pid, signal.SIGSTOP)


def restart(down_seconds: float = 5.0) -> None:
    """Restart dockerd (its running containers stop with it) with ``down_seconds`` of
    no daemon in between (scripts/engines/docker/engine.py: restart); only in the
    process that started the engine."""
    # the instance that started the engine (conftest.py loads this file under that name)
    started = sys.modules.get("fiber_test_engine_docker")
    state = _state if _state is not None else getattr(started, "_state", None)
    if state is None:
        raise RuntimeError("the docker engine was not started by this process")
    _engine().restart(state, down_seconds)


def thaw() -> None:
    """SIGCONT the cluster manager (harmless when it runs)."""
    for pid in manager_pids():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
