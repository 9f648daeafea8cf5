"""``fiber run --build`` and ``fiber build`` against the real test engine and a real
registry (Debian's docker-registry on 127.0.0.1, started and stopped here).

The program has a module next to its main script and a dependency installed from a
local wheel (into a directory on the launching process's PYTHONPATH, not the test
venv); the image starts from a bare Python (the test Python's installation, nothing
installed, no venv), where ``import fiber`` fails. The first run builds, pushes and
runs, and its pool's workers run from the same image; the second, with the image
removed from the engine, builds and pushes nothing (the registry sees no upload) and
the engine pulls the image back; an edited module gives a new tag, whose push sends
only the program's layer. Bad inputs: a directory that does not exist, a Dockerfile
that fails, a registry that refuses pushes, each a clear error within seconds."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import docker
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


registry_engine = _load("fiber_test_registry", ROOT / "scripts/engines/registry/registry.py")
build_image = _load("fiber_test_build_image", ROOT / "scripts/engines/docker/build_image.py")

MAIN = """\
import sys

import fiber
from mylib import step

if __name__ == "__main__":
    with fiber.Pool(2) as pool:
        print("results", pool.map(step, range(4)))
    print("main ran", sys.executable, fiber.__file__)
"""
MYLIB = """\
import fibertestdep

VERSION = "{version}"


def step(x):
    return VERSION + ":" + str(fibertestdep.double(x))
"""


def _wheel(directory: Path) -> Path:
    """A wheel of the distribution fibertestdep 1.0 (one module), written by hand."""
    files = {
        "fibertestdep.py": b"def double(x):\n    return 2 * x\n",
        "fibertestdep-1.0.dist-info/METADATA":
            b"Metadata-Version: 2.1\nName: fibertestdep\nVersion: 1.0\n",
        "fibertestdep-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: fiber-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
        "fibertestdep-1.0.dist-info/top_level.txt": b"fibertestdep\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(data)}")
    record.append("fibertestdep-1.0.dist-info/RECORD,,")
    path = directory / "fibertestdep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("fibertestdep-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def registry(docker_engine, engine_client):
    """A registry on a new port: its images' names are new to the engine too."""
    state = registry_engine.start()
    yield state
    for image in engine_client.images.list():
        if any(tag.startswith(state["address"] + "/") for tag in image.tags):
            engine_client.images.remove(image.id, force=True)
    directory = state["dir"]
    assert registry_engine.stop(state) == []
    assert not os.path.exists(directory)
    assert not os.path.exists(f"/proc/{state['pid']}")


@pytest.fixture(scope="module")
def bare_base(docker_engine, engine_client) -> str:
    """A Python-only image (the test Python's installation, nothing installed)."""
    return build_image.build(engine_client, sys.executable, repository="fiber-test-bare",
                             bare=True)


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    """fibertestdep installed from its wheel into a directory of its own."""
    work = tmp_path_factory.mktemp("wheel")
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--target", str(target), str(_wheel(work))], check=True)
    return target


def _env(deps: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("FIBER_IMAGE", "FIBER_DOCKER_VOLUMES")}
    env["PYTHONPATH"] = str(deps)
    env["FIBER_BACKEND"] = "docker"
    env.update(settings)
    return env


def _fiber(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600
           ) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fiber", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def _program(directory: Path, version: str) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "main.py").write_text(MAIN)
    (directory / "mylib.py").write_text(MYLIB.format(version=version))
    return directory


def _reference(stderr: str) -> str:
    found = re.search(r"127\.0\.0\.1:\d+/prog:[0-9a-f]{20}", stderr)
    assert found, f"no image reference in:\n{stderr}"
    return found.group(0)


def test_run_build_pushes_reuses_and_sees_an_edit(tmp_path, deps, registry, bare_base,
                                                  engine_client):
    prog = _program(tmp_path / "prog", "v1")
    env = _env(deps, FIBER_IMAGE_REGISTRY=registry["address"], FIBER_IMAGE_BASE=bare_base)
    # the base has nothing of fiber nor of the program
    with pytest.raises(docker.errors.ContainerError):
        engine_client.containers.run(bare_base, ["python3", "-c", "import fiber"],
                                     network_mode="host", remove=True)
    assert registry_engine.tags(registry, "prog") == []

    first, took = _fiber(["run", "--build", "--", "python3", "main.py"], prog, env)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "results ['v1:0', 'v1:2', 'v1:4', 'v1:6']" in first.stdout
    assert "/opt/fiber/site-packages/fiber/__init__.py" in first.stdout  # fiber of the image
    reference = _reference(first.stderr)
    assert f"building {reference}" in first.stderr and "pushed" in first.stderr
    assert registry_engine.tags(registry, "prog") == [reference.rpartition(":")[2]]
    uploads = registry_engine.blob_uploads(registry)
    assert uploads >= 3  # the base's layer, the packages', the program's, the config
    print(f"first run: {took:.1f} s, {uploads} blobs uploaded")

    # the same program: nothing built or pushed; the engine pulls the image back (the
    # tag goes, its parents stay: they are the engine's build cache, without which the
    # edit below would rebuild the packages' layer, whose bytes differ from build to
    # build, e.g. the directories' times, and push it again)
    engine_client.images.remove(reference, noprune=True)
    fetched = sum(1 for m, p, s in registry_engine.requests(registry)
                  if m == "GET" and "/blobs/" in p)
    second, took = _fiber(["run", "--build", "--", "python3", "main.py"], prog, env)
    assert second.returncode == 0, second.stderr + second.stdout
    assert "results ['v1:0', 'v1:2', 'v1:4', 'v1:6']" in second.stdout
    assert "nothing to build or push" in second.stderr and "building" not in second.stderr
    assert registry_engine.blob_uploads(registry) == uploads
    assert sum(1 for m, p, s in registry_engine.requests(registry)
               if m == "GET" and "/blobs/" in p) > fetched  # pulled from the registry
    print(f"second run: {took:.1f} s")

    # an edited module: a new tag, only the program's layer (and the config) sent
    (prog / "mylib.py").write_text(MYLIB.format(version="v2"))
    third, took = _fiber(["run", "--build", "--", "python3", "main.py"], prog, env)
    assert third.returncode == 0, third.stderr + third.stdout
    assert "results ['v2:0', 'v2:2', 'v2:4', 'v2:6']" in third.stdout
    edited = _reference(third.stderr)
    assert edited != reference and edited.rpartition(":")[0] == reference.rpartition(":")[0]
    sent = registry_engine.uploaded(registry)[uploads:]
    assert len(sent) == 2, (sent, registry_engine.uploaded(registry), third.stderr)
    assert sorted(registry_engine.tags(registry, "prog")) == sorted(
        r.rpartition(":")[2] for r in (reference, edited))
    print(f"edited run: {took:.1f} s")


def test_build_prints_the_reference_and_a_missing_directory_fails_at_once(
        tmp_path, deps, registry, bare_base):
    prog = _program(tmp_path / "prog", "v1")
    env = _env(deps, FIBER_IMAGE_REGISTRY=registry["address"], FIBER_IMAGE_BASE=bare_base)
    done, _ = _fiber(["build", str(prog)], tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(registry["address"] + "/prog:")

    done, took = _fiber(["build", str(tmp_path / "nowhere")], tmp_path, env)
    assert done.returncode == 1
    assert f"cannot build an image of {str(tmp_path / 'nowhere')!r}: no such directory" \
        in done.stderr
    assert took < 10
    done, _ = _fiber(["run", "--build=nowhere", "--", "python3", "main.py"], tmp_path, env)
    assert done.returncode == 1 and "no such directory" in done.stderr


def test_a_dockerfile_that_fails_shows_the_end_of_its_log(tmp_path, deps, registry,
                                                          bare_base):
    prog = tmp_path / "broken"
    prog.mkdir()
    (prog / "main.py").write_text("print('never')\n")
    (prog / "Dockerfile").write_text(
        f"FROM {bare_base}\nRUN echo preparing-step-output && exit 3\n")
    env = _env(deps, FIBER_IMAGE_REGISTRY=registry["address"])
    done, took = _fiber(["run", "--build", "--", "python3", "main.py"], prog, env)
    assert done.returncode == 1
    assert f"the Dockerfile of {prog} failed to build" in done.stderr
    assert "returned a non-zero code: 3" in done.stderr
    assert "preparing-step-output" in done.stderr  # the tail of the build log
    assert "never" not in done.stdout
    assert took < 30
    assert registry_engine.tags(registry, "broken") == []


def test_a_registry_that_refuses_the_push_says_so(tmp_path, deps, bare_base, engine_client):
    refusing = registry_engine.start(readonly=True)
    try:
        prog = _program(tmp_path / "prog", "v1")
        env = _env(deps, FIBER_IMAGE_REGISTRY=refusing["address"],
                   FIBER_IMAGE_BASE=bare_base)
        done, took = _fiber(["run", "--build", "--", "python3", "main.py"], prog, env)
        assert done.returncode == 1
        assert (f"the registry {refusing['address']} (image_registry setting) refused "
                "the push") in done.stderr
        assert "results" not in done.stdout
        assert took < 60
        print(done.stderr)
    finally:
        assert registry_engine.stop(refusing) == []
    for image in engine_client.images.list(name=f"{refusing['address']}/prog"):
        engine_client.images.remove(image.id, force=True)
