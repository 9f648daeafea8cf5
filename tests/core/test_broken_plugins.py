"""A broken plugin breaks only itself (issue #45). Each case writes two plugin
distributions into a temporary directory put on a fresh interpreter's path (modules
and a ``.dist-info`` with its ``fiber`` entry point: found by importlib.metadata and
pluggy as any installed distribution; nothing of fiber or importlib is faked): the
working plugin ``fiber-good`` (backend ``good``) and ``fiber-bad`` (entry point
``bad``), broken in one way. Then, for real, in subprocesses: ``fiber backends``
lists ``bad`` as broken with its fault and exits 0 (1 with ``--strict``), ``fiber
config`` works; a program
runs a Pool on ``local`` and a Process on ``good``, with at most one warning about
``bad``; and selecting ``bad`` (a context, ``fiber.init``, ``FIBER_BACKEND``,
``pytest --fiber-backend``) gives one error naming the fault."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fiber.backend import CONTRACT_VERSION

GOOD_BACKEND = """
    from fiber.backend.local.backend import LocalBackend

    class {name}(LocalBackend):
        name = "{backend}"
    """

# an honest declaration of fiber-bad, which each case breaks in one place
BAD_PLUGIN = f"""
    from fiber.backend import Plugin

    plugin = Plugin(package="fiber-bad", contract={CONTRACT_VERSION},
                    backends={{"bad": "fiber_bad_backend:BadBackend"}})
    """

MISSING_TERMINATE = """
    from fiber.backend import Backend

    class BadBackend(Backend):
        secrets_delivery = "env"

        def create_job(self, spec):
            raise AssertionError("never called")

        def status(self, job):
            raise AssertionError("never called")
    """

NO_SECRETS_DELIVERY = """
    from fiber.backend.local.backend import LocalBackend

    class BadBackend(LocalBackend):
        secrets_delivery = None
    """

# case: (fiber_bad.py, fiber_bad_backend.py, the entry point, what the fault says,
# whether it is known when the plugins load (one warning) or when the backend's
# class is imported (no warning: the module is imported only when the backend is used))
CASES = {
    "contract": (BAD_PLUGIN.replace(f"contract={CONTRACT_VERSION}",
                                    f"contract={CONTRACT_VERSION + 1}"),
                 GOOD_BACKEND.format(name="BadBackend", backend="bad"), "fiber_bad:plugin",
                 [f"declares contract={CONTRACT_VERSION + 1} in its Plugin",
                  f"speaks contract version {CONTRACT_VERSION} only",
                  "fiber-core>=0.1 is what its metadata requires",
                  f"changes its declaration to contract={CONTRACT_VERSION}",
                  f"a fiber-core that speaks contract {CONTRACT_VERSION + 1}"], True),
    "attribute": (BAD_PLUGIN, GOOD_BACKEND.format(name="BadBackend", backend="bad"),
                  "fiber_bad:plugn",
                  ["its entry point does not resolve: 'fiber_bad' has no attribute "
                   "'plugn' (did you mean 'plugin'?)", "pyproject.toml"], True),
    "module": (BAD_PLUGIN, GOOD_BACKEND.format(name="BadBackend", backend="bad"),
               "fiber_bda:plugin",
               ["its entry point does not resolve: there is no module 'fiber_bda'"],
               True),
    "import": ("import nosuchclient\n" + textwrap.dedent(BAD_PLUGIN),
               GOOD_BACKEND.format(name="BadBackend", backend="bad"), "fiber_bad:plugin",
               ["importing 'fiber_bad' raised ModuleNotFoundError: No module named "
                "'nosuchclient'", "fiber_bad.py:1"], True),
    "declaration": (BAD_PLUGIN.replace("fiber_bad_backend:BadBackend",
                                       "fiber_bad_backend.BadBackend"),
                    GOOD_BACKEND.format(name="BadBackend", backend="bad"),
                    "fiber_bad:plugin",
                    ["importing 'fiber_bad' raised ValueError: backend 'bad' of fiber-bad: "
                     "'fiber_bad_backend.BadBackend' is not a dotted path"], True),
    "not_a_plugin": ("plugin = {'bad': 'fiber_bad_backend:BadBackend'}\n",
                     GOOD_BACKEND.format(name="BadBackend", backend="bad"),
                     "fiber_bad:plugin",
                     ["names {'bad': 'fiber_bad_backend:BadBackend'}, which is not a "
                      "fiber.backend.Plugin"], True),
    "old_hooks": ("import pluggy\n\n@pluggy.HookimplMarker('fiber')\n"
                  "def fiber_backends():\n    return {}\n",
                  GOOD_BACKEND.format(name="BadBackend", backend="bad"), "fiber_bad",
                  ["implements hooks fiber-core does not have (fiber_backends)",
                   "requires fiber-core>=0.1"], True),
    "class": (BAD_PLUGIN, MISSING_TERMINATE, "fiber_bad:plugin",
              ["its Plugin declares 'bad': 'fiber_bad_backend:BadBackend'",
               "BadBackend does not implement the required method terminate of "
               "fiber.backend.Backend (required: create_job, status, terminate, "
               "secrets_delivery)"], False),
    "secrets": (BAD_PLUGIN, NO_SECRETS_DELIVERY, "fiber_bad:plugin",
                ["BadBackend.secrets_delivery is None; it is required"], False),
    "path": (BAD_PLUGIN.replace("BadBackend", "BadBackand"),
             GOOD_BACKEND.format(name="BadBackend", backend="bad"), "fiber_bad:plugin",
             ["its Plugin declares 'bad': 'fiber_bad_backend:BadBackand'",
              "'fiber_bad_backend' has no attribute 'BadBackand' (did you mean "
              "'BadBackend'?)"], False),
}


def _dist(root: Path, name: str, version: str, modules: dict[str, str], entry: str) -> None:
    """The distribution ``name`` in ``root``: its modules and a .dist-info with its
    entry point ``[fiber]`` and its fiber-core requirement."""
    for module, text in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(text))
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: "
                                   f"{version}\nRequires-Dist: fiber-core>=0.1\n")
    (info / "entry_points.txt").write_text(f"[fiber]\n{entry}\n")


@pytest.fixture(params=sorted(CASES))
def site(request, tmp_path):
    """A directory with fiber-good and the case's fiber-bad, and the environment of a
    process that has them installed (its path)."""
    plugin, backend, entry, fault, warned = CASES[request.param]
    root = tmp_path / "site"
    root.mkdir()
    _dist(root, "fiber-good", "1.0", {
        "fiber_good": """
            from fiber.backend import Plugin

            plugin = Plugin(package="fiber-good", contract=1,
                            backends={"good": "fiber_good_backend:GoodBackend"})
            """,
        "fiber_good_backend": GOOD_BACKEND.format(name="GoodBackend", backend="good")},
        "good = fiber_good:plugin")
    _dist(root, "fiber-bad", "0.3", {"fiber_bad": plugin, "fiber_bad_backend": backend},
          f"bad = {entry}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("FIBER_BACKEND", None)
    return env, fault, warned, tmp_path


def _run(args: list[str], env: dict[str, str], cwd: Path, **more: str
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env={**env, **more}, cwd=cwd,
                          capture_output=True, text=True, timeout=180)


def _says_fault(text: str, fault: list[str]) -> bool:
    return all(part in text for part in fault)


def test_fiber_backends_lists_the_broken_plugin_and_exits_0(site):
    env, fault, warned, cwd = site
    done = _run(["-m", "fiber", "backends"], env, cwd)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "good   fiber-good 1.0" in lines, done.stdout
    assert "local  fiber-core " in done.stdout and "BROKEN" not in done.stdout.split(
        "bad")[0], done.stdout
    (bad,) = [line for line in lines if line.startswith("bad ")]
    assert "fiber-bad 0.3  BROKEN: " in bad, bad
    assert _says_fault(bad, fault), bad
    assert "reinstall" not in bad, bad
    if warned:  # the one warning, naming the distribution, entry point and fault
        (warning,) = done.stderr.strip().splitlines()
        assert warning.startswith("the fiber plugin fiber-bad 0.3 (entry point 'bad' = "), \
            warning
        assert _says_fault(warning, fault), warning
    else:
        assert done.stderr == ""
    strict = _run(["-m", "fiber", "backends", "--strict"], env, cwd)
    assert strict.returncode == 1 and strict.stdout == done.stdout, strict
    settings = _run(["-m", "fiber", "config"], env, cwd)  # the other diagnostic tool
    assert settings.returncode == 0 and "backend " in settings.stdout, settings.stderr


PROGRAM = """
    import sys
    import fiber
    from fiber.errors import PluginContractError

    def square(x):
        return x * x

    if __name__ == "__main__":
        which = sys.argv[1]
        if which == "others":
            with fiber.Pool(2) as pool:
                print("local", pool.map(square, range(4)))
            p = fiber.get_context("good").Process(target=square, args=(3,))
            p.start()
            p.join(60)
            print("good", p.exitcode)
            for select in ("context", "init"):
                try:
                    if select == "context":
                        fiber.get_context("bad")
                    else:
                        fiber.init(backend="bad")
                except (ValueError, PluginContractError) as exc:
                    print(select, type(exc).__name__, exc)
                else:
                    print(select, "no error")
        else:  # FIBER_BACKEND=bad
            p = fiber.Process(target=square, args=(3,))
            try:
                p.start()
            except PluginContractError as exc:
                print("env", type(exc).__name__, exc)
            else:
                print("env no error")
                p.join(60)
    """


def test_other_backends_run_and_selecting_it_is_one_clear_error(site):
    env, fault, warned, cwd = site
    (cwd / "main.py").write_text(textwrap.dedent(PROGRAM))
    done = _run(["main.py", "others"], env, cwd)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["local [0, 1, 4, 9]", "good 0"], done.stdout + done.stderr
    context, init = lines[2:]
    assert context.startswith("context ValueError cannot find context for 'bad': the "
                              "fiber backend 'bad'"), context
    assert init.startswith("init PluginContractError fiber.init(): the fiber backend "
                           "'bad'"), init
    for line in (context, init):
        assert _says_fault(line, fault), line
    # one warning in the whole program (its pool's jobs and the forkserver load the
    # plugins too, and say nothing), none when the fault shows only on use
    assert done.stderr.count("the fiber plugin fiber-bad") == (1 if warned else 0), \
        done.stderr
    env_selected = _run(["main.py", "env"], env, cwd, FIBER_BACKEND="bad")
    assert env_selected.returncode == 0, env_selected.stderr
    assert env_selected.stdout.startswith("env PluginContractError "), env_selected.stdout
    assert _says_fault(env_selected.stdout, fault), env_selected.stdout


def test_pytest_fiber_backend_of_it_is_a_usage_error(site):
    env, fault, warned, cwd = site
    done = _run(["-m", "pytest", "--fiber-backend", "bad", "-q", "-p", "no:cacheprovider"],
                env, cwd)
    out = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    assert "INTERNALERROR" not in out, out[-3000:]
    assert "--fiber-backend bad: the fiber backend 'bad'" in out, out
    assert _says_fault(out, fault), out


def test_a_name_two_plugins_claim_is_set_aside_alone(tmp_path):
    """Two plugins declaring the same backend name: that name is set aside, naming
    both (it used to fail every program); their other backends work."""
    root = tmp_path / "site"
    root.mkdir()
    for package, names in (("fiber-one", ("twin", "solo")), ("fiber-two", ("twin",))):
        module = package.replace("-", "_")
        backends = ", ".join(f"{n!r}: 'fiber_good_backend:GoodBackend'" for n in names)
        _dist(root, package, "1.0", {module: f"""
            from fiber.backend import Plugin

            plugin = Plugin(package={package!r}, contract=1, backends={{{backends}}})
            """}, f"{module} = {module}:plugin")
    (root / "fiber_good_backend.py").write_text(textwrap.dedent(
        GOOD_BACKEND.format(name="GoodBackend", backend="")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("FIBER_BACKEND", None)
    listing = _run(["-m", "fiber", "backends"], env, tmp_path)
    assert listing.returncode == 0, listing.stderr
    assert "solo   fiber-one 1.0" in listing.stdout.splitlines(), listing.stdout
    (twin,) = [line for line in listing.stdout.splitlines() if line.startswith("twin")]
    assert twin == ("twin   fiber-one 1.0  BROKEN: the fiber backend name 'twin' is "
                    "provided by fiber-one 1.0 (fiber_good_backend:GoodBackend) and by "
                    "fiber-two 1.0 (fiber_good_backend:GoodBackend): uninstall all but "
                    "one of them"), twin
    (tmp_path / "main.py").write_text(textwrap.dedent("""
        import fiber
        from fiber.errors import PluginContractError

        def square(x):
            return x * x

        if __name__ == "__main__":
            p = fiber.get_context("solo").Process(target=square, args=(2,))
            p.start()
            p.join(60)
            print("solo", p.exitcode)
            try:
                fiber.init(backend="twin")
            except PluginContractError as exc:
                print("twin", exc)
        """))
    done = _run(["main.py"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "solo 0", done.stdout + done.stderr
    assert lines[1].startswith("twin fiber.init(): the fiber backend 'twin' cannot be "
                               "used: "), lines
    assert "provided by fiber-one 1.0 (fiber_good_backend:GoodBackend) and by " \
        "fiber-two 1.0" in lines[1]


def test_a_known_package_that_cannot_load_is_named_for_its_other_name(tmp_path):
    """fiber-k8s provides "kubernetes" (its entry point's name) and is what `k8s`
    means: when it cannot even be imported, selecting either name gives its fault, not
    advice to install the package that is installed."""
    from fiber.backend import registry

    if "fiber-k8s" in {info.package for info in registry.backends().values()}:
        pytest.skip("the real fiber-k8s is installed here")
    root = tmp_path / "site"
    root.mkdir()
    _dist(root, "fiber-k8s", "0.1.0", {"fiber_k8s_stale": "import kubernetes_gone\n"},
          "kubernetes = fiber_k8s_stale:plugin")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("FIBER_BACKEND", None)
    for name in ("kubernetes", "k8s"):
        done = _run(["-c", f"import fiber; fiber.init(backend={name!r})"], env, tmp_path)
        # the exception's line (the traceback's last but its troubleshooting note)
        last = [line for line in done.stderr.strip().splitlines()
                if not line.startswith("troubleshooting: ")][-1]
        assert last.startswith(f"fiber.errors.PluginContractError: fiber.init(): the fiber "
                               f"backend {name!r} cannot be used: the fiber plugin "
                               "fiber-k8s 0.1.0 (entry point 'kubernetes' = "
                               "'fiber_k8s_stale:plugin') is not used: its entry point "
                               "does not resolve: importing 'fiber_k8s_stale' raised "
                               "ModuleNotFoundError"), last
