"""Test engine of the ``kubernetes`` backend: a real one-node cluster (etcd,
kube-apiserver, scheduler, controller-manager, kubelet with dockershim over a dockerd of
its own) in a network namespace, started by ``scripts/engines/k8s/start.sh`` and torn
down by ``stop.sh``; plus the test image (this Python and the test venv, imported
into that dockerd). The checkout is mounted read-only into the pods at its own path.

Settings that are not fiber settings are exported as ``FK8S_TEST_*`` (the state dir,
the docker socket and a kubeconfig of a user without any rights).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "engines" / "k8s"
_state: dict[str, str] = {}


def _log(message: str) -> None:
    sys.stderr.write(f"[k8s engine] {message}\n")


def start() -> dict[str, str]:
    """Start the cluster; meanwhile make the test image's tarball, and import it as soon
    as the cluster's dockerd is up (start.sh says DOCKER_READY=...) while the node gets
    Ready."""
    began = time.monotonic()
    image = _ImageImport()
    image.start()
    proc = subprocess.Popen(["bash", str(SCRIPTS / "start.sh")], stdout=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    values: dict[str, str] = {}
    for line in proc.stdout:
        if "=" in line:
            key, value = line.rstrip("\n").split("=", 1)
            values[key] = value
            if key == "STATE":
                _state["STATE"] = value
            elif key == "DOCKER_READY":
                image.docker_ready(value)
    returncode = proc.wait()
    _state.update(values)
    if returncode != 0:
        image.docker_ready(None)
        image.join()
        stop()
        raise RuntimeError("scripts/engines/k8s/start.sh failed (see its output above)")
    _log(f"cluster up in {time.monotonic() - began:.1f}s (state {values['STATE']})")
    image.docker_ready(values["DOCKER_HOST"])  # (if start.sh did not say it before)
    image.join()
    if image.error is not None:
        stop()
        raise image.error
    _log(f"cluster and image ready in {time.monotonic() - began:.1f}s")
    return {
        "FIBER_IMAGE": image.tag,
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


class _ImageImport(threading.Thread):
    """Make the test image's tarball (this Python + the test venv; image.py caches it),
    then ``docker import`` it into the cluster's dockerd once that is up."""

    def __init__(self) -> None:
        super().__init__(name="fk8s-image", daemon=True)
        self.tag = ""
        self.error: BaseException | None = None
        self._docker_host: str | None = None
        self._ready = threading.Event()

    def docker_ready(self, docker_host: str | None) -> None:
        """The cluster's dockerd is up at ``docker_host`` (None: it never will be)."""
        if not self._ready.is_set():
            self._docker_host = docker_host
            self._ready.set()

    def run(self) -> None:
        try:
            began = time.monotonic()
            tarball = subprocess.run(
                [sys.executable, str(SCRIPTS / "image.py"), "--skip", str(ROOT)],
                check=True, stdout=subprocess.PIPE, text=True).stdout.strip()
            _log(f"image tarball {tarball} ready in {time.monotonic() - began:.1f}s")
            self._ready.wait()
            if self._docker_host is None:
                return
            began = time.monotonic()
            tag = f"fiber-k8s/python:{Path(tarball).stem}"
            env = {**os.environ, "DOCKER_HOST": self._docker_host}
            with open(tarball, "rb") as data:
                subprocess.run(["docker", "import", "-", tag], stdin=data, env=env,
                               check=True, stdout=subprocess.DEVNULL)
            self.tag = tag
            _log(f"image {tag} imported in {time.monotonic() - began:.1f}s")
        except BaseException as exc:  # noqa: BLE001 -- reported by start()
            self.error = exc


def _procs_module():
    spec = importlib.util.spec_from_file_location("fiber_k8s_test_procs", SCRIPTS / "procs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded(state: str) -> dict[str, tuple[int, str]]:
    """name -> (pid, start time) of every server start.sh started."""
    recorded = {}
    for path in sorted(Path(state, "pids").glob("*")):
        fields = path.read_text().split()
        if len(fields) == 2:
            recorded[path.name] = (int(fields[0]), fields[1])
    return recorded


def leftovers(state: str, cluster_id: str, recorded: dict[str, tuple[int, str]],
              netns: str | None = None) -> list[str]:
    """What of the cluster in ``state`` still exists: its recorded servers (same pid and
    start time), any process of it (command line or cgroup in it: containers, shims,
    containerd; see procs.py), its network namespace, its state dir."""
    procs = _procs_module()
    found = []
    for name, (pid, since) in recorded.items():
        if procs.running(pid, since):
            found.append(f"{name} (pid {pid})")
    exclude = procs.ancestors(os.getpid())
    found += [f"pid {pid}: {command}"
              for pid, command in procs.cluster_processes(state, cluster_id, exclude)]
    if netns and Path("/var/run/netns", netns).exists():
        found.append(f"network namespace {netns}")
    if Path(state).exists():
        found.append(f"state dir {state}")
    return found


def stop() -> None:
    """Stop the cluster (stop.sh), then check that nothing it started is left: raises
    RuntimeError naming what is (so the session fails loudly)."""
    state = _state.pop("STATE", None)
    _state.clear()
    if not state:
        return
    began = time.monotonic()
    cluster_id = Path(state).name.split(".", 1)[-1]  # start.sh: /tmp/fk8s.<id>
    netns = f"fk8s-{cluster_id}"
    recorded: dict[str, tuple[int, str]] = {}
    returncode = 0
    if Path(state).exists():  # (a failed start.sh has stopped what it started)
        recorded = _recorded(state)
        returncode = subprocess.run(["bash", str(SCRIPTS / "stop.sh"), state], check=False,
                                    stdin=subprocess.DEVNULL).returncode
    left = leftovers(state, cluster_id, recorded, netns)
    if returncode != 0 or left:
        raise RuntimeError(
            f"the test cluster {cluster_id} was not stopped completely (stop.sh exit "
            f"{returncode}); left: {', '.join(left) or 'nothing found'}")
    _log(f"cluster stopped in {time.monotonic() - began:.1f}s; none of its "
         f"{len(recorded)} servers, containers or other processes is left")


def manager_pids() -> list[int]:
    """kube-apiserver's pid, as start.sh recorded it in ``FK8S_TEST_STATE``."""
    state = Path(os.environ["FK8S_TEST_STATE"])
    return [int((state / "pids" / "apiserver").read_text().split()[0])]


# -- an outage of the cluster manager (the fault tests and bench/faults.py) -----------
def freeze() -> None:
    """Take the cluster manager away: SIGSTOP kube-apiserver (found from the settings in the
    environment, so any process of the session may call it). ``thaw()`` brings it back."""
    for pid in manager_pids():
        os.kill(pid, signal.SIGSTOP)


def thaw() -> None:
    """SIGCONT the cluster manager (harmless when it runs)."""
    for pid in manager_pids():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
