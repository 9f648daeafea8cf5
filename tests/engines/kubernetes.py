"""Test engine of the ``kubernetes`` backend: a real one-node cluster (etcd,
kube-apiserver, scheduler, controller-manager, kubelet with dockershim over a dockerd of
its own) in a network namespace, started by ``scripts/engines/k8s/start.sh`` and torn
down by ``stop.sh``; plus the test image (this Python and the test venv, imported
into that dockerd). The checkout is mounted read-only into the pods at its own path.

Settings that are not fiber settings are exported as ``FK8S_TEST_*`` (the state dir,
the docker socket and a kubeconfig of a user without any rights).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "engines" / "k8s"
_state: dict[str, str] = {}


def _log(message: str) -> None:
    sys.stderr.write(f"[k8s engine] {message}\n")


def start() -> dict[str, str]:
    began = time.monotonic()
    proc = subprocess.run(["bash", str(SCRIPTS / "start.sh")], stdout=subprocess.PIPE,
                          text=True, stdin=subprocess.DEVNULL)
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    if "STATE" in values:
        _state.update(values)
    if proc.returncode != 0:
        stop()
        raise RuntimeError("scripts/engines/k8s/start.sh failed (see its output above)")
    _log(f"cluster up in {time.monotonic() - began:.1f}s (state {values['STATE']})")
    try:
        image = _import_image(values["DOCKER_HOST"])
    except BaseException:
        stop()
        raise
    _log(f"cluster and image ready in {time.monotonic() - began:.1f}s")
    return {
        "FIBER_IMAGE": image,
        "FIBER_KUBERNETES_KUBECONFIG": values["KUBECONFIG"],
        "FIBER_KUBERNETES_NAMESPACE": "default",
        "FIBER_KUBERNETES_LISTEN_ADDRESS": values["HOST_IP"],
        "FIBER_KUBERNETES_HOST_NETWORK": "true",
        # the portable tests tell workers apart by os.getpid(): pids in pods repeat
        "FIBER_KUBERNETES_HOST_PID": "true",
        "FIBER_KUBERNETES_HOST_PATHS": f"{ROOT}:ro",
        "FIBER_KUBERNETES_IMAGE_PULL_POLICY": "Never",
        "FK8S_TEST_STATE": values["STATE"],
        "FK8S_TEST_DOCKER_HOST": values["DOCKER_HOST"],
        "FK8S_TEST_NOBODY_KUBECONFIG": values["NOBODY_KUBECONFIG"],
        "FK8S_TEST_NODE_IP": values["NODE_IP"],
        "FK8S_TEST_POD_CIDR": values["POD_CIDR"],
    }


def _import_image(docker_host: str) -> str:
    """Import the test image (this Python + the test venv) into the cluster's dockerd."""
    began = time.monotonic()
    tarball = subprocess.run(
        [sys.executable, str(SCRIPTS / "image.py"), "--skip", str(ROOT)],
        check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
    tag = f"fiber-k8s/python:{Path(tarball).stem}"
    env = {**os.environ, "DOCKER_HOST": docker_host}
    with open(tarball, "rb") as data:
        subprocess.run(["docker", "import", "-", tag], stdin=data, env=env, check=True,
                       stdout=subprocess.DEVNULL)
    _log(f"image {tag} imported in {time.monotonic() - began:.1f}s")
    return tag


def stop() -> None:
    state = _state.pop("STATE", None)
    _state.clear()
    if state:
        subprocess.run(["bash", str(SCRIPTS / "stop.sh"), state], check=False,
                       stdin=subprocess.DEVNULL)
        if Path(state).exists():
            raise RuntimeError(f"the test cluster in {state} was not removed completely")
