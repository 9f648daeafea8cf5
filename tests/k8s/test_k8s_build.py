"""``fiber run --build --backend kubernetes`` against the test cluster and a real
registry (Debian's docker-registry) started here in the node's network namespace on
127.0.0.1, where the node's Docker engine builds and pushes the image and the kubelet
pulls it (``imagePullPolicy: Always``, so every pod of the run is pulled from the
registry, not taken from the build).

The program (tests/docker/test_build.py's: a module next to its main script, a
dependency installed from a local wheel into a directory on the launching process's
PYTHONPATH) runs as a pod of an image made from a bare Python, where ``import fiber``
fails; its Pool's workers are pods of the same image. A second run builds and uploads
nothing; an edited module gives a new tag that the pods run.

What is not the real thing: the image is built on the node's own engine (a laptop
would build on its own and push over the network), and the program's pod reaches the
API server with the admin kubeconfig, mounted read-only from the cluster's state
directory through ``kubernetes_host_paths`` (the test cluster has no service proxy, so
the in-cluster address does not route); nothing of fiber or of the program is mounted.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
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
docker_build_tests = _load("fiber_test_docker_build", ROOT / "tests/docker/test_build.py")


@pytest.fixture(scope="module")
def node_engine(k8s_engine):
    client = docker.DockerClient(base_url=k8s_engine["FK8S_TEST_DOCKER_HOST"], version="auto")
    yield client
    client.close()


@pytest.fixture(scope="module")
def registry(k8s_engine, node_engine):
    netns = Path(k8s_engine["FK8S_TEST_STATE"], "netns").read_text().strip()
    state = registry_engine.start(netns=netns)
    yield state
    for image in node_engine.images.list():
        if any(tag.startswith(state["address"] + "/") for tag in image.tags):
            node_engine.images.remove(image.id, force=True)
    directory = state["dir"]
    assert registry_engine.stop(state) == []
    assert not os.path.exists(directory)
    assert not os.path.exists(f"/proc/{state['pid']}")


@pytest.fixture(scope="module")
def bare_base(node_engine) -> str:
    return build_image.build(node_engine, sys.executable, repository="fiber-test-bare",
                             bare=True)


@pytest.fixture(scope="module")
def deps(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    target = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--target", str(target),
                    str(docker_build_tests._wheel(work))], check=True)
    return target


def _env(k8s_engine, deps: Path, registry: dict, base: str) -> dict[str, str]:
    state = k8s_engine["FK8S_TEST_STATE"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("FIBER_IMAGE", "FIBER_KUBERNETES_HOST_PATHS")}
    env.update({
        "PYTHONPATH": str(deps),
        "FIBER_BACKEND": "kubernetes",
        "FIBER_DOCKER_HOST": k8s_engine["FK8S_TEST_DOCKER_HOST"],
        "FIBER_IMAGE_REGISTRY": registry["address"],
        "FIBER_IMAGE_BASE": base,
        "FIBER_KUBERNETES_IMAGE_PULL_POLICY": "Always",
        "FIBER_KUBERNETES_HOST_PATHS": f"{state}:ro",
        # the program's pod listens on its own address (the node's), not the host end
        # of the veth that the tests' own processes use
        "FIBER_KUBERNETES_LISTEN_ADDRESS": "",
    })
    return env


def _run(prog: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "fiber", "run", "--build", "--",
                           "python3", "main.py"], cwd=prog, env=env, capture_output=True,
                          text=True, timeout=600)
    return done, time.monotonic() - started


def _reference(stderr: str) -> str:
    found = re.search(r"127\.0\.0\.1:\d+/prog:[0-9a-f]{20}", stderr)
    assert found, f"no image reference in:\n{stderr}"
    return found.group(0)


def _pulls(registry: dict, reference: str) -> int:
    tag = reference.rpartition(":")[2]
    return sum(1 for method, path, status in registry_engine.requests(registry)
               if method in ("GET", "HEAD") and path.endswith(f"/manifests/{tag}")
               and status == 200)


def test_run_build_on_kubernetes(tmp_path, k8s_engine, node_engine, registry, bare_base,
                                 deps):
    prog = docker_build_tests._program(tmp_path / "prog", "v1")
    env = _env(k8s_engine, deps, registry, bare_base)
    with pytest.raises(docker.errors.ContainerError):
        node_engine.containers.run(bare_base, ["python3", "-c", "import fiber"],
                                   network_mode="host", remove=True)
    assert registry_engine.tags(registry, "prog") == []

    first, took = _run(prog, env)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "results ['v1:0', 'v1:2', 'v1:4', 'v1:6']" in first.stdout
    assert "/opt/fiber/site-packages/fiber/__init__.py" in first.stdout
    reference = _reference(first.stderr)
    assert "pushed" in first.stderr
    assert registry_engine.tags(registry, "prog") == [reference.rpartition(":")[2]]
    uploads = registry_engine.blob_uploads(registry)
    # the program's pod and its two workers' pods each pulled it (pull policy Always)
    assert _pulls(registry, reference) >= 3
    print(f"first run: {took:.1f} s, {uploads} blobs uploaded")

    second, took = _run(prog, env)
    assert second.returncode == 0, second.stderr + second.stdout
    assert "results ['v1:0', 'v1:2', 'v1:4', 'v1:6']" in second.stdout
    assert "nothing to build or push" in second.stderr and "building" not in second.stderr
    assert registry_engine.blob_uploads(registry) == uploads
    print(f"second run: {took:.1f} s")

    (prog / "mylib.py").write_text(docker_build_tests.MYLIB.format(version="v2"))
    third, took = _run(prog, env)
    assert third.returncode == 0, third.stderr + third.stdout
    assert "results ['v2:0', 'v2:2', 'v2:4', 'v2:6']" in third.stdout
    edited = _reference(third.stderr)
    assert edited != reference
    assert registry_engine.blob_uploads(registry) - uploads == 2
    assert _pulls(registry, edited) >= 3
    print(f"edited run: {took:.1f} s")
