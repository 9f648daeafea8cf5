"""A program whose jobs run a bare Python gets its code and packages shipped (issue #38).

The jobs' interpreter is a fresh ``venv --without-pip`` of Debian's ``/usr/bin/python3``
(the same version as the tests' Python): nothing is installed for it, which the
fixture proves (``import fiber`` fails there). The program has a module next to its
main script (``from mylib import step``) and a dependency, ``shipdep``, installed
from a wheel this test builds, into a directory on the launcher's ``PYTHONPATH`` only
(the jobs run with ``-I``: they cannot see it but shipped). Each run is a fresh
interpreter on the local backend, with its own ship cache, store (``TMPDIR``) and a
token in its environment to find leftover processes. What was sent is read from the
parent's count of archives sent whole (``fiber.runtime.ship.serving.sent``, printed by
the program).

The bad inputs of the issue each give a clear error within seconds, and nothing
half-installed is left in the cache.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from procs import processes_with
from ship_program import MAIN, make_wheel

BARE = "/usr/bin/python3"

@pytest.fixture(scope="module")
def env_dirs(tmp_path_factory):
    """The bare interpreter and the site directory where shipdep is installed."""
    if not os.path.exists(BARE):
        pytest.skip(f"{BARE} is missing")
    version = subprocess.run([BARE, "-c", "import sys, sysconfig; print(sys.version_info[:2], "
                              "sysconfig.get_config_var('SOABI'))"],
                             capture_output=True, text=True).stdout.strip()
    import sysconfig
    ours = f"{tuple(sys.version_info[:2])} {sysconfig.get_config_var('SOABI')}"
    if version != ours:
        pytest.skip(f"{BARE} is {version}, not like this Python ({ours})")
    base = tmp_path_factory.mktemp("ship-env")
    subprocess.run([BARE, "-m", "venv", "--without-pip", str(base / "bare")], check=True)
    bare = str(base / "bare" / "bin" / "python")
    proof = subprocess.run([bare, "-c", "import fiber"], capture_output=True, text=True)
    assert proof.returncode != 0 and "No module named 'fiber'" in proof.stderr
    site = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), str(make_wheel(base))], check=True)
    proof = subprocess.run([bare, "-c", "import shipdep"], capture_output=True, text=True)
    assert proof.returncode != 0
    return {"bare": bare, "site": str(site)}


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "main.py").write_text(MAIN)
    (root / "mylib.py").write_text("def step(x):\n    return x + 1\n")
    (root / ".gitignore").write_text("*.log\nbuild/\n")
    (root / "noise.log").write_text("not shipped\n")
    (root / "build").mkdir()
    (root / "build" / "big.bin").write_bytes(b"\0" * 100)
    return root


def run(project: Path, env_dirs: dict, settings: dict, workers: int = 2,
        extra_env: dict | None = None, timeout: float = 120) -> dict:
    token = uuid.uuid4().hex
    tmp = project.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    settings = {"python": env_dirs["bare"], "ship_cache": str(project.parent / "cache"),
                **settings}
    env = {**os.environ, "FIBER_BACKEND": "local", "SHIP_TEST_TOKEN": token,
           "PYTHONPATH": env_dirs["site"], "TMPDIR": str(tmp),
           "SHIP_TEST_SETTINGS": json.dumps(settings), "SHIP_TEST_WORKERS": str(workers),
           **(extra_env or {})}
    result = subprocess.run([sys.executable, "main.py"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=timeout)
    deadline = time.monotonic() + 10
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token) == [], "processes of the program are still running"
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["stderr"] = result.stderr
    return report


def _no_partial(cache: Path) -> None:
    left = [p for p in glob.glob(str(cache / ".*")) if ".partial-" in p or ".evicted-" in p]
    assert left == [], left


def test_a_bare_python_runs_the_program_then_the_cache_serves_it(project, env_dirs):
    cache = project.parent / "cache"
    first = run(project, env_dirs, {"ship": ["pkg:shipdep"]}, workers=3)
    assert first["results"] == [x * 10 + 1 for x in range(8)], first
    # every task ran in the bare interpreter, from the host's cache
    for seen in first["where"]:
        assert seen["python"] == env_dirs["bare"]
        for name in ("fiber", "mylib", "shipdep"):
            assert seen[name].startswith(str(cache) + "/"), seen
        assert seen["cwd"] == os.path.dirname(seen["mylib"])
    # two archives (code, packages), each sent once for three jobs of one host
    assert sorted(first["sent"].values()) == [1, 1], first["sent"]
    code_dir = Path(first["where"][0]["mylib"]).parent
    assert (code_dir / "mylib.py").exists() and not (code_dir / "noise.log").exists()
    assert not (code_dir / "build").exists()
    assert oct((cache).stat().st_mode & 0o777) == "0o700"
    _no_partial(cache)

    second = run(project, env_dirs, {"ship": ["pkg:shipdep"]})
    assert second["results"] == first["results"]
    assert second["sent"] == {}, "the second run transferred again"

    (project / "mylib.py").write_text("def step(x):\n    return x + 2\n")
    third = run(project, env_dirs, {"ship": ["pkg:shipdep"]})
    assert third["results"] == [x * 10 + 2 for x in range(8)]
    assert list(third["sent"].values()) == [1], "only the changed code travels"
    assert third["where"][0]["mylib"] != first["where"][0]["mylib"]


def test_the_default_ships_nothing(project, env_dirs):
    """ship=auto on the local backend: jobs run this interpreter's bootstrap as before
    (forked from the template), and nothing is packed or sent."""
    out = run(project, env_dirs, {"python": sys.executable})
    assert out["results"] == [x * 10 + 1 for x in range(8)]
    assert out["sent"] == {}
    assert all(seen["python"] == sys.executable for seen in out["where"])
    assert not (project.parent / "tmp" / f"fiber-ship-{os.getuid()}").exists()


def _error(out: dict) -> dict:
    assert "results" not in out, out
    assert out["elapsed"] < 20, f"the error took {out['elapsed']:.1f}s"
    return out["error"]


def test_a_path_that_does_not_exist(project, env_dirs):
    error = _error(run(project, env_dirs, {"ship": ["no_such_dir_xyz"]}))
    assert error["type"] == "ShipError", error
    assert "no_such_dir_xyz" in error["message"] and "does not exist" in error["message"]


def test_an_archive_over_the_limit_names_the_largest_files(project, env_dirs):
    (project / "data.bin").write_bytes(os.urandom(3 << 20))
    (project / "small.bin").write_bytes(os.urandom(1 << 10))
    error = _error(run(project, env_dirs, {"ship": ["on"], "ship_limit": "1"}))
    assert error["type"] == "ShipError"
    assert "over the ship_limit of 1.0 MiB" in error["message"], error
    assert str(project / "data.bin") in error["message"]
    assert "3.0 MiB" in error["message"]


def test_an_unreadable_file(project, env_dirs):
    """A file whose bytes cannot be read. As root, mode 000 does not stop a read: a
    symbolic link to itself does (ELOOP), through the same path of the code."""
    bad = project / "secret.txt"
    if os.geteuid() == 0:
        bad.symlink_to(bad)
    else:
        bad.write_text("x")
        bad.chmod(0)
    error = _error(run(project, env_dirs, {"ship": ["on"]}))
    assert error["type"] == "ShipError"
    assert f"cannot read {bad}" in error["message"], error


def test_a_package_not_installed(project, env_dirs):
    error = _error(run(project, env_dirs, {"ship": ["pkg:no_such_package_xyz"]}))
    assert error["type"] == "ShipError"
    assert "no_such_package_xyz" in error["message"] and "not installed" in error["message"]


def _other_python() -> str | None:
    """An interpreter of another minor version on this machine, if any."""
    minor = sys.version_info[1]
    for candidate in [*(f"python3.{m}" for m in (minor + 1, minor - 1, minor + 2)),
                      *glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin/python3"))]:
        path = shutil.which(candidate) or (candidate if os.path.isfile(candidate) else None)
        if not path or not os.access(path, os.X_OK):
            continue
        out = subprocess.run([path, "-c", "import sys; print(sys.version_info[1])"],
                             capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip().isdigit() \
                and int(out.stdout) != minor and int(out.stdout) >= 7:
            return path
    return None


def test_an_incompatible_python_is_refused_before_any_task(project, env_dirs):
    other = _other_python()
    if other is None:
        pytest.skip("no Python of another version on this machine")
    error = _error(run(project, env_dirs, {"ship": ["on"], "python": other}))
    assert error["type"] == "ProcessStartError", error
    assert error["reason"] == "cannot run on its host"
    message = error["message"]
    assert other in message and sys.executable in message, message
    assert "Install Python {}.{}".format(*sys.version_info[:2]) in message


def test_a_missing_python(project, env_dirs):
    error = _error(run(project, env_dirs, {"ship": ["on"],
                                           "python": "/nonexistent/python3"}))
    assert "/nonexistent/python3" in error["message"], error


def test_a_cache_directory_of_another_user_is_refused(project, env_dirs):
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory to another user")
    cache = project.parent / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    error = _error(run(project, env_dirs, {"ship": ["on"]}))
    assert error["type"] == "ProcessStartError", error
    assert "belongs to user id 65534" in error["message"], error
    assert str(cache) in error["message"]
    assert os.listdir(cache) == []


def test_a_disk_that_fills_during_the_unpack(project, env_dirs):
    """The cache on a tmpfs of 1 MiB: the packages (several MiB) cannot fit."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root, to mount a small tmpfs")
    cache = project.parent / "cache"
    cache.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs",
                              str(cache)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        error = _error(run(project, env_dirs, {"ship": ["on"]}))
        assert error["type"] == "ProcessStartError", error
        assert "is full" in error["message"] and str(cache) in error["message"], error
        # nothing half-written is left to be used: at most the small code archive's
        # entry, complete
        entries = [n for n in os.listdir(cache) if not n.endswith(".lock")]
        assert len(entries) <= 1 and all(len(n) == 64 for n in entries), entries
        for name in entries:
            assert (cache / name / ".fiber-ship.json").exists()
        _no_partial(cache)
    finally:
        subprocess.run(["umount", str(cache)], check=True)


def test_the_pages_commands(tmp_path, env_dirs):
    """docs/laptop-to-cluster.md's local section, as written there: its two files, its
    commands, and what they print (archive keys and sizes aside: the packages' change
    with fiber's own files)."""
    import re

    page = (Path(__file__).resolve().parents[2] / "docs" / "laptop-to-cluster.md").read_text()
    section = page[page.index("## Try it on this machine"):page.index("## SSH hosts")]
    project = tmp_path / "myproject"
    project.mkdir()
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        name = re.match(r"# myproject/(\S+)\n", block).group(1)
        (project / name).write_text(block)
    console = re.search(r"```console\n(.*?)```", section, re.S).group(1)
    commands = [line[2:] for line in console.splitlines() if line.startswith("$ ")]
    assert commands[-1] == commands[-2] and "FIBER_SHIP=on" in commands[-1]
    bare = tmp_path / "bare"  # the page's /tmp/bare, made as the page makes it
    subprocess.run([BARE, "-m", "venv", "--without-pip", str(bare)], check=True)
    proof = subprocess.run([str(bare / "bin" / "python"), "-c", "import fiber"],
                           capture_output=True, text=True)
    assert "ModuleNotFoundError: No module named 'fiber'" in proof.stderr
    env = {**os.environ, "TMPDIR": str(tmp_path), "PATH": os.path.dirname(sys.executable)
           + os.pathsep + os.environ["PATH"]}
    lines = console.splitlines()
    shown = [line for line in lines[lines.index("$ " + commands[-2]) + 1:] if line]

    def output(command: str) -> list[str]:
        command = command.replace("/tmp/bare", str(bare))
        done = subprocess.run(command, shell=True, cwd=project, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        assert done.returncode == 0, done.stdout
        return [re.sub(r"archive [0-9a-f]{12}, [0-9.]+ MiB", "archive K, N MiB", line)
                for line in done.stdout.splitlines()]

    expected = [re.sub(r"archive [0-9a-f]{12}, [0-9.]+ MiB", "archive K, N MiB", line)
                for line in shown]
    first, second = output(commands[-2]), output(commands[-1])
    assert first + ["$ " + commands[-1]] + second == expected
