"""Which modules a fresh fiber program has loaded, stage by stage.

Run as a script (``python tests/module_probe.py``), it prints as JSON the sorted
``sys.modules`` of a new interpreter after ``import fiber``, after reading a setting
(``fiber.get_config_value("backend")``, which loads every plugin's entry point), after
listing the installed backends, and the ``sys.modules`` that a local ``Process`` and a
local ``Pool`` worker report from inside the job. Tests import :func:`probe` and
:func:`unwanted` to check that fiber loads no backend's client library before that
backend is used (tests/core; tests/k8s and tests/ssh with the plugins installed).
"""

from __future__ import annotations

import os  # os and sys are loaded with any interpreter: the first stage shows fiber's
import sys

# The cluster client libraries of the backend plugins (and the libraries that make
# them heavy), and the plugins' backend modules: none of them may be loaded by a
# process that does not use that backend.
CLIENT_LIBRARIES = ("docker", "kubernetes", "paramiko", "requests", "urllib3", "cryptography")
BACKEND_MODULES = ("fiber_docker.backend", "fiber_k8s.backend", "fiber_ssh.backend",
                   "fiber_slurm.backend")
STAGES = ("import", "setting", "backends", "process", "pool_worker")


def unwanted(modules: list[str]) -> list[str]:
    """The client libraries and plugin backend modules among ``modules``."""
    return sorted(m for m in modules
                  if m.split(".")[0] in CLIENT_LIBRARIES or m.startswith(BACKEND_MODULES))


def probe(tmp_path: os.PathLike | str, env: dict[str, str] | None = None,
          timeout: float = 180) -> dict[str, dict]:
    """Run this script in a fresh interpreter, in ``tmp_path`` (so that no
    ``.fiberconfig`` of the caller applies), with no ``FIBER_*`` setting from the
    environment (the local backend) but those of ``env``. Returns ``{stage: {"pid":
    process id, "modules": [name, ...]}}``."""
    import json
    import subprocess
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    done = subprocess.run([sys.executable, os.path.abspath(__file__)], cwd=tmp_path,
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    stages = json.loads(done.stdout)
    assert set(stages) == set(STAGES), stages.keys()
    parent = stages["import"]["pid"]
    assert stages["process"]["pid"] != parent and stages["pool_worker"]["pid"] != parent
    return stages


def check_plugins(tmp_path: os.PathLike | str, plugins: dict[str, tuple[str, ...]],
                  start_method: str) -> None:
    """With the plugins installed. ``plugins`` maps each entry-point module to what
    using its backend loads: the backend module, then its client libraries. Reading a
    setting loads every entry-point module, yet nothing of :func:`unwanted` is loaded at
    any stage, in the parent or in a local job. And the check can fail: importing the
    backend module does load what is listed."""
    import subprocess

    stages = probe(tmp_path, env={"FIBER_LOCAL_START_METHOD": start_method})
    for entry_point in plugins:
        assert entry_point in stages["setting"]["modules"], f"{entry_point} was not loaded"
    for stage in STAGES:
        found = unwanted(stages[stage]["modules"])
        assert found == [], f"loaded at stage {stage!r}: {found}"
    for backend, *clients in plugins.values():
        code = f"import sys, {backend}; print(' '.join(sys.modules))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, check=True)
        found = unwanted(done.stdout.split())
        assert backend in found and all(c in found for c in clients), (backend, found)


def loaded() -> dict:
    """This process's id and its loaded modules."""
    return {"pid": os.getpid(), "modules": sorted(sys.modules)}


def _report(queue) -> None:
    queue.put(loaded())


def main() -> None:
    stages = {}
    import fiber

    stages["import"] = loaded()
    fiber.get_config_value("backend")
    stages["setting"] = loaded()
    from fiber.backend import registry

    registry.backends()
    stages["backends"] = loaded()
    queue = fiber.Queue()
    process = fiber.Process(target=_report, args=(queue,))
    process.start()
    stages["process"] = queue.get(timeout=120)
    process.join(60)
    with fiber.Pool(1) as pool:
        stages["pool_worker"] = pool.apply_async(loaded).get(timeout=120)
    import json

    json.dump(stages, sys.stdout)


if __name__ == "__main__":
    main()
