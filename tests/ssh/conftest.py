"""Fixtures of the ssh backend's tests: the real test hosts (started here when the
session was not run with ``--fiber-backend ssh``), backends built from the real settings, and
a check that every test leaves no process behind on the hosts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_helpers import ROOT, _load, describe, wait_no_leftovers

from fiber.backend import registry
from fiber.runtime import config
from fiber_ssh.backend import SSHBackend


@pytest.fixture(scope="session")
def ssh_hosts() -> Iterator[dict[str, Any]]:
    """The state of the test hosts (addresses, namespaces, keys, sshd pids)."""
    engine = None
    saved = dict(os.environ)
    if not os.environ.get("FSSH_TEST_STATE"):
        engine = _load("fiber_test_engine_ssh_local", ROOT / "tests" / "engines" / "ssh.py")
        os.environ.update(engine.start())
    try:
        yield json.loads(Path(os.environ["FSSH_TEST_STATE"]).read_text())
    finally:
        if engine is not None:
            os.environ.clear()
            os.environ.update(saved)
            engine.stop()


@pytest.fixture(scope="session")
def ssh_options(ssh_hosts) -> dict[str, Any]:
    """Every fiber setting as the test session's environment gives it."""
    values = config.load().as_dict()
    assert values["ssh_hosts"], "FIBER_SSH_HOSTS is not set"
    return values


@pytest.fixture
def make_backend(ssh_hosts, ssh_options) -> Iterator[Callable[..., SSHBackend]]:
    """Build ssh backends with setting overrides; closes them and checks that nothing
    of theirs is left running on the hosts."""
    made: list[SSHBackend] = []

    def make(**overrides: Any) -> SSHBackend:
        backend = SSHBackend({**ssh_options, **overrides})
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()
    left = wait_no_leftovers(ssh_hosts)
    assert not left, f"processes left on the test hosts: {describe(left)}"



@pytest.fixture
def ssh_fiber(ssh_hosts, monkeypatch):
    """fiber set to the ssh backend with a fresh backend instance (both hosts up); the
    instance is closed at the end (it may have seen a host die)."""
    monkeypatch.setenv("FIBER_BACKEND", "ssh")
    config.reset()
    registry.reset_instances()
    yield
    registry.reset_instances()
    config.reset()
