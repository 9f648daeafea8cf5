"""The plugin contract is data, checked at load: a tiny plugin distribution written by
each test into a temporary directory (a module and a ``.dist-info`` with its ``fiber``
entry point and its ``Requires-Dist``; nothing installed, nothing faked) is found
through its entry point by a fresh interpreter, through pluggy as any installed
plugin is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fiber.backend import CONTRACT_VERSION


def _tiny_plugin(root: Path, *, contract: int | str, requires: str | None = None,
                 entry: str = "fiber_tiny:plugin", module: str | None = None) -> Path:
    """Write the distribution ``fiber-tiny`` into ``root``: ``fiber_tiny.py`` declares
    backend ``tiny`` (the dotted path of a class in ``fiber_tiny_backend.py``, which
    records its import in ``sys.modules`` as any module does)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "fiber_tiny.py").write_text(module or textwrap.dedent(f"""
        from fiber.backend import ConfigOption, Plugin

        plugin = Plugin(package="fiber-tiny", contract={contract!r},
                        backends={{"tiny": "fiber_tiny_backend:TinyBackend"}},
                        options=[ConfigOption("tiny_size", int, 3, "a tiny setting")])
        """))
    (root / "fiber_tiny_backend.py").write_text(textwrap.dedent("""
        from fiber.backend.local.backend import LocalBackend

        class TinyBackend(LocalBackend):
            name = "tiny"
        """))
    info = root / "fiber_tiny-0.3.0.dist-info"
    info.mkdir(exist_ok=True)
    metadata = "Metadata-Version: 2.1\nName: fiber-tiny\nVersion: 0.3.0\n"
    if requires:
        metadata += f"Requires-Dist: {requires}\n"
    (info / "METADATA").write_text(metadata)
    (info / "entry_points.txt").write_text(f"[fiber]\ntiny = {entry}\n")
    return root


def _python(root: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("FIBER_BACKEND", None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_backend_path_is_resolved_lazily_through_pluggys_hook_calling(tmp_path):
    """The registry reads the declarations by calling the hook through pluggy (a
    hook-call monitor, which sees only calls made by pluggy's machinery, records it
    with the tiny plugin among the implementations), and imports the backend's
    module only when the backend is created."""
    root = _tiny_plugin(tmp_path / "site", contract=CONTRACT_VERSION)
    result = _python(root, """
        import json, sys
        import pluggy
        from fiber.backend import registry

        calls = []
        real = pluggy.PluginManager.add_hookspecs

        def specs(pm, module):  # the registry adds them before it loads the plugins
            real(pm, module)
            pm.add_hookcall_monitoring(
                lambda hook, impls, kwargs: calls.append(
                    [hook, sorted(i.plugin_name for i in impls)]),
                lambda outcome, hook, impls, kwargs: None)

        pluggy.PluginManager.add_hookspecs = specs
        found = registry.backends()
        options = [o.name for o in registry.config_options()]
        before = "fiber_tiny_backend" in sys.modules
        backend = registry.get_backend("tiny", {"local_start_method": "spawn"})
        print(json.dumps({
            "calls": calls, "path": found["tiny"].path, "package": found["tiny"].package,
            "version": found["tiny"].version, "options": options,
            "imported_before_use": before,
            "imported_after_use": "fiber_tiny_backend" in sys.modules,
            "class": type(backend).__module__ + ":" + type(backend).__name__}))
        backend.close()
        """)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert ["fiber_plugin", ["local", "tiny"]] in seen["calls"]
    assert seen["path"] == "fiber_tiny_backend:TinyBackend"
    assert (seen["package"], seen["version"]) == ("fiber-tiny", "0.3.0")
    assert "tiny_size" in seen["options"] and "local_start_method" in seen["options"]
    assert seen["imported_before_use"] is False
    assert seen["imported_after_use"] is True
    assert seen["class"] == "fiber_tiny_backend:TinyBackend"


def _broken(root: Path) -> str:
    """What a fresh interpreter with ``root`` on its path finds: the backends, and the
    one plugin it set aside with its fault (it raises nothing: a broken plugin breaks
    only itself, tests/core/test_broken_plugins.py)."""
    result = _python(root, """
        import fiber
        from fiber.backend import registry
        from fiber.runtime import config

        config.get_config()  # every setting of the plugins that loaded
        print("BACKENDS", sorted(registry.backends()))
        (broken,) = registry.broken()
        print("BROKEN", broken.describe())
        """)
    assert result.returncode == 0, result.stderr
    assert "BACKENDS ['local']" in result.stdout, result.stdout
    return result.stdout.split("BROKEN ", 1)[1]


def test_contract_mismatch_names_both_contracts_and_what_to_change(tmp_path):
    root = _tiny_plugin(tmp_path / "site", contract=CONTRACT_VERSION + 1,
                        requires="fiber-core>=0.2,<0.3")
    out = _broken(root)
    assert out.startswith("the fiber plugin fiber-tiny 0.3.0 (entry point 'tiny' = "
                          "'fiber_tiny:plugin') is not used: "), out
    assert f"it declares contract={CONTRACT_VERSION + 1} in its Plugin" in out
    assert f"speaks contract version {CONTRACT_VERSION} only" in out
    assert "fiber-core>=0.2,<0.3 is what its metadata requires" in out
    assert f"its author changes its declaration to contract={CONTRACT_VERSION}" in out


def test_contract_mismatch_without_a_pin_names_the_contract(tmp_path):
    root = _tiny_plugin(tmp_path / "site", contract=CONTRACT_VERSION + 1)
    out = _broken(root)
    assert ("a fiber-core whose fiber.backend.CONTRACT_VERSION is "
            f"{CONTRACT_VERSION + 1}") in out
    assert "metadata requires" not in out


@pytest.mark.parametrize("entry", ["fiber_tiny", "fiber_tiny:old_style"])
def test_entry_point_of_an_older_contract_is_refused(tmp_path, entry):
    """An entry point naming a module with the hooks of the contract before version 1
    (``fiber_backends``), or one that declares nothing (metadata left from an older
    install), is set aside naming the package and its fault, not a backend silently
    missing."""
    module = textwrap.dedent("""
        import pluggy
        hookimpl = pluggy.HookimplMarker("fiber")

        @hookimpl
        def fiber_backends():
            return {"tiny": None}

        class old_style:
            pass
        """)
    root = _tiny_plugin(tmp_path / "site", contract=CONTRACT_VERSION, entry=entry,
                        module=module, requires="fiber-core>=0.0.1,<0.1")
    out = _broken(root)
    assert out.startswith(f"the fiber plugin fiber-tiny 0.3.0 (entry point 'tiny' = "
                          f"{entry!r}) is not used: the entry point "), out
    assert ("implements hooks fiber-core does not have (fiber_backends)"
            if entry == "fiber_tiny" else "which is not a fiber.backend.Plugin") in out
    assert "fiber-tiny requires fiber-core>=0.0.1,<0.1" in out


def test_a_plugin_declaration_checks_its_dotted_paths():
    from fiber.backend import Plugin

    with pytest.raises(ValueError, match="'fiber_tiny_backend.TinyBackend' is not a dotted"):
        Plugin(package="fiber-tiny", contract=CONTRACT_VERSION,
               backends={"tiny": "fiber_tiny_backend.TinyBackend"})
