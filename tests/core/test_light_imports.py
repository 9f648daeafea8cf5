"""`import fiber` is light: a fresh interpreter that imports fiber loads none of its
runtime, wire or plugin registry (nor pynng, pluggy, cloudpickle), and no backend's
client library is loaded by reading a setting, by listing the backends or inside a local
job (Process and Pool worker, forked from the template or spawned), as the job reports
from its own ``sys.modules``. The same checks with the plugins installed are in
tests/k8s and tests/ssh; here no plugin is installed, so the plugin registry's own
loading is what is checked."""

from __future__ import annotations

import pytest
from module_probe import probe, unwanted

NOT_AT_IMPORT = ("fiber.wire", "fiber.runtime", "fiber.backend", "fiber.pool",
                 "fiber.process", "fiber.context", "pynng", "pluggy", "cloudpickle", "numpy")


@pytest.fixture(scope="module", params=["forkserver", "spawn"])
def stages(request, tmp_path_factory) -> dict[str, dict]:
    return probe(tmp_path_factory.mktemp("probe"),
                 env={"FIBER_LOCAL_START_METHOD": request.param})


def test_import_fiber_loads_only_its_face(stages):
    mods = stages["import"]["modules"]
    assert "fiber" in mods and "fiber._version" in mods
    heavy = [m for m in mods if m.startswith(NOT_AT_IMPORT)]
    assert heavy == [], f"`import fiber` loaded {heavy}"
    assert "typing" not in mods  # the lazy face needs no typing at run time


def test_reading_a_setting_loads_the_registry_but_no_client_library(stages):
    mods = stages["setting"]["modules"]
    assert "fiber.backend.registry" in mods and "pluggy" in mods  # entry points were loaded
    assert unwanted(mods) == []
    assert unwanted(stages["backends"]["modules"]) == []


@pytest.mark.parametrize("job", ["process", "pool_worker"])
def test_a_local_job_loads_no_client_library(stages, job):
    mods = stages[job]["modules"]  # reported by the job (another pid: see probe)
    assert "fiber.runtime.run" in mods  # a fiber job's own list
    assert unwanted(mods) == []
