"""A program shipped to SSH hosts that have only the system's Python (issue #38).

The hosts are the test engine's network namespaces, started here as *bare* hosts
(``scripts/engines/ssh/hosts.py up --hide``): each sshd runs in a mount namespace of
its own where the repository, the tests' environment, pyenv and fiber's cache
directory are empty, and ``/tmp`` is the host's own (its ship cache with it). The
test proves it on each host before the run: ``python3 -c "import fiber"`` fails, the
tests' interpreter and the repository are not there. Then the program of
tests/ship_program.py (a module next to its main script, a dependency from a wheel
built here, installed where only the launcher sees it) runs with ``ship`` on: correct
results, every task run by the host's ``/usr/bin/python3.11`` from the host's cache,
each archive sent once per host; a second run sends nothing; an edited module is
seen, and only the code travels again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ssh_helpers import ROOT, describe, hosts_script, wait_no_leftovers

HOSTS = 2
PYTHON = "python{}.{}".format(*sys.version_info[:2])


def _hidden() -> list[str]:
    """What holds the developer's environment: the repository, the tests' venv and
    the interpreter it was made from, fiber's caches."""
    places = {str(ROOT), sys.prefix, os.path.realpath(sys.base_prefix),
              "/var/cache/fiber", os.path.expanduser("~/.pyenv"),
              os.path.expanduser("~/.local"), os.path.expanduser("~/.cache")}
    return sorted(p for p in places if p not in ("/", "/usr", "/usr/local") and os.path.isdir(p))


@pytest.fixture(scope="module")
def bare_hosts() -> Iterator[dict[str, Any]]:
    if os.geteuid() != 0:
        pytest.skip("the ssh test hosts need root")
    base = tempfile.mkdtemp(prefix="fiber-ssh-bare-")
    script = str(ROOT / "scripts" / "engines" / "ssh" / "hosts.py")
    argv = [sys.executable, script, "up", "--dir", base, "--count", str(HOSTS),
            "--owner", str(os.getpid())]
    for place in _hidden():
        argv += ["--hide", place]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        pytest.fail(f"cannot start the bare ssh hosts: {done.stderr.strip()}")
    state = json.loads(done.stdout)
    try:
        yield state
    finally:
        subprocess.run([sys.executable, script, "down", "--dir", base], check=False,
                       stdin=subprocess.DEVNULL)
        assert not hosts_script.pids_in_namespaces(state["namespaces"])


def _ssh(state: dict[str, Any], host: dict[str, Any], command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", state["key_file"], "-o", f"UserKnownHostsFile={state['known_hosts']}",
         "-o", "BatchMode=yes", "-p", str(host["port"]), f"root@{host['address']}", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _settings(state: dict[str, Any]) -> dict[str, str]:
    return {
        "FIBER_BACKEND": "ssh",
        "FIBER_SSH_HOSTS": ",".join(f"root@{h['address']}:{h['port']}*8"
                                    for h in state["hosts"]),
        "FIBER_SSH_KEY_FILE": state["key_file"],
        "FIBER_SSH_KNOWN_HOSTS": state["known_hosts"],
    }


def test_the_hosts_have_nothing_of_fiber(bare_hosts):
    for host in bare_hosts["hosts"]:
        out = _ssh(bare_hosts, host, 'python3 -c "import fiber"')
        assert out.returncode != 0 and "No module named 'fiber'" in out.stderr, out
        out = _ssh(bare_hosts, host, f"{PYTHON} -c 'import sys; print(sys.version)'; "
                                     f"ls {sys.executable} {ROOT}/fiber_core 2>&1")
        assert out.stdout.startswith(sys.version.split()[0][:4]), out
        assert out.stdout.count("No such file or directory") == 2, out.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    from ship_program import make_wheel

    base = tmp_path_factory.mktemp("ship-site")
    target = base / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(target), str(make_wheel(base))], check=True)
    return str(target)


def _run(project: Path, state: dict[str, Any], site: str, settings: dict[str, Any],
         workers: int = 4, wait: bool = True) -> dict[str, Any]:
    token = uuid.uuid4().hex
    tmp = project.parent / "tmp"  # (the launcher's store of sent archives: the test's)
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, **_settings(state), "SHIP_TEST_TOKEN": token, "PYTHONPATH": site,
           "TMPDIR": str(tmp),
           "SHIP_TEST_SETTINGS": json.dumps(settings), "SHIP_TEST_WORKERS": str(workers),
           "SHIP_TEST_WAIT": "1" if wait else ""}
    result = subprocess.run([sys.executable, "main.py"], cwd=project, env=env,
                            capture_output=True, text=True, timeout=240)
    left = wait_no_leftovers(state)
    assert not left, f"processes left on the hosts: {describe(left)}"
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_program_runs_on_bare_hosts_and_their_caches_serve_it_again(
        bare_hosts, site, tmp_path):
    from ship_program import MAIN

    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "mylib.py").write_text("def step(x):\n    return x + 1\n")
    settings = {"ship": ["pkg:shipdep"]}
    names = {h["name"] for h in bare_hosts["hosts"]}

    first = _run(project, bare_hosts, site, settings)
    assert first.get("results") == [x * 10 + 1 for x in range(8)], json.dumps(first)
    hosts = {seen["host"] for seen in first["where"]}
    assert hosts <= names
    cache = f"/tmp/fiber-ship-{os.getuid()}/"
    for seen in first["where"]:
        assert os.path.basename(seen["python"]) == PYTHON or seen["python"].startswith("/usr/")
        for name in ("fiber", "mylib", "shipdep"):
            assert seen[name].startswith(cache), seen
    # each archive once per host: 4 workers, placed on the host with the most free
    # slots (so 2 on each), fetch twice, not 4 times
    assert sorted(first["sent"].values()) == [HOSTS] * 2, first["sent"]

    second = _run(project, bare_hosts, site, settings)
    assert second.get("results") == first["results"], json.dumps(second)
    assert second["sent"] == {}, "the hosts' caches did not serve the second run"

    (project / "mylib.py").write_text("def step(x):\n    return x + 2\n")
    third = _run(project, bare_hosts, site, settings)
    assert third.get("results") == [x * 10 + 2 for x in range(8)], json.dumps(third)
    assert list(third["sent"].values()) == [HOSTS], third["sent"]


def test_a_python_missing_on_the_hosts_is_a_clear_error(bare_hosts, site, tmp_path):
    from ship_program import MAIN

    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "mylib.py").write_text("def step(x):\n    return x\n")
    out = _run(project, bare_hosts, site, {"ship": ["pkg:shipdep"], "python": "python3.99"},
               workers=2, wait=False)
    assert "results" not in out, out
    assert out["elapsed"] < 30, out
    assert "python3.99" in out["error"]["message"], out


def test_the_es_example_runs_on_bare_hosts(bare_hosts, tmp_path):
    """``examples/es.py`` (numpy, gymnasium) from a copy of examples/, shipped with
    gymnasium and what it requires: a short training on 4 workers of the two hosts."""
    pytest.importorskip("gymnasium", reason="the ES example needs gymnasium")
    import shutil

    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", examples)
    history = tmp_path / "es.json"
    env = {**os.environ, **_settings(bare_hosts), "FIBER_SHIP": "pkg:gymnasium",
           "FIBER_LOG_LEVEL": "INFO", "TMPDIR": str(tmp_path)}
    try:  # (within pytest's 300 s, so that a run that takes longer shows its output)
        result = subprocess.run(
            [sys.executable, "es.py", "--workers", "4", "--iterations", "2", "--population",
             "8", "--max-steps", "50", "--json", str(history)],
            cwd=examples, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"es.py ran over 240 s:\n{exc.stdout!s:.3000}\n{exc.stderr!s:.5000}")
    left = wait_no_leftovers(bare_hosts)
    assert not left, f"processes left on the hosts: {describe(left)}"
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    records = json.loads(history.read_text())
    assert len(records) == 2, records
