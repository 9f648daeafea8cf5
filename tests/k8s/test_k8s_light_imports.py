"""The kubernetes and docker plugins are light (this environment installs both): reading
a setting loads their entry points, yet neither kubernetes nor docker (nor their
backends) is imported by it, by listing the backends, or inside a local job. Needs no
cluster: a fresh interpreter on the local backend (tests/module_probe.py)."""

from __future__ import annotations

import pytest
from module_probe import check_plugins

PLUGINS = {"fiber_k8s.plugin": ("fiber_k8s.backend", "kubernetes", "urllib3"),
           "fiber_docker.plugin": ("fiber_docker.backend", "docker", "requests")}


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_plugins_load_no_client_library(tmp_path, start_method):
    check_plugins(tmp_path, PLUGINS, start_method)
