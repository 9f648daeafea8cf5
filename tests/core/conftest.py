"""Helpers for core tests: running a Python script in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


@pytest.fixture
def run_script(tmp_path):
    """Write ``code`` to a script and run it with this Python; returns the
    CompletedProcess (text output)."""

    def run(code: str, env: dict | None = None, timeout: float = 120, name: str = "main.py"):
        script = Path(tmp_path) / name
        script.write_text(textwrap.dedent(code))
        full_env = {**os.environ, **(env or {})}
        return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env=full_env, timeout=timeout, cwd=tmp_path)

    return run


@pytest.fixture
def fresh_config():
    """Forget cached settings and backends before and after the test."""
    from fiber.backend import registry
    from fiber.runtime import config

    config.reset()
    registry.reset_instances()
    yield
    config.reset()
    registry.reset_instances()
