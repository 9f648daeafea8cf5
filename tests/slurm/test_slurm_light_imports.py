"""The slurm plugin is light: reading a setting loads its entry point, yet its backend
(command runner, batch-script templates) is imported neither by it, by listing the
backends, nor inside a local job. Needs no cluster: a fresh interpreter on the local
backend (tests/module_probe.py)."""

from __future__ import annotations

import pytest
from module_probe import check_plugins


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_plugin_loads_no_backend_module(tmp_path, start_method):
    check_plugins(tmp_path, {"fiber_slurm.plugin": ("fiber_slurm.backend",)}, start_method)
