"""The docker plugin is light: reading a setting loads its entry point, yet the Docker
client (docker, requests, urllib3) and the backend are imported neither by it, by listing
the backends, nor inside a local job. Needs no engine: a fresh interpreter on the local
backend (tests/module_probe.py)."""

from __future__ import annotations

import pytest
from module_probe import check_plugins


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_plugin_loads_no_client_library(tmp_path, start_method):
    check_plugins(tmp_path, {"fiber_docker.plugin": ("fiber_docker.backend", "docker",
                                                     "requests", "urllib3")}, start_method)
