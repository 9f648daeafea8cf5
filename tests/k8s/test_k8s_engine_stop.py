"""The test cluster's stop.sh ends every process it started, by recorded pid and start
time, and then anything else of the cluster (by command line or cgroup), with
SIGKILL for what ignores SIGTERM; the engine's leftover check sees what is left.

These tests FAKE the cluster's servers with ``sleep`` processes in a state dir of their
own (starting a second real cluster would cost a minute); the real cluster of the
session is checked by ``tests/engines/kubernetes.py``'s ``stop()``, which fails the
session when any of its servers, containers or other processes is left."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "engines" / "k8s"


def _engine():
    spec = importlib.util.spec_from_file_location("fk8s_engine_under_test",
                                                  ROOT / "tests" / "engines" / "kubernetes.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_time(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()[19]


def _detached(state: Path, script: str) -> int:
    """Run ``script`` (bash) from ``state`` as a detached process (its parent exits, so
    init reaps it) and return its pid."""
    out = subprocess.run(
        ["bash", "-c", f"( exec setsid bash -c {shlex.quote(script)} >/dev/null 2>&1 </dev/null ) & "
                       "echo $!"],
        cwd=state, check=True, stdout=subprocess.PIPE, text=True).stdout
    pid = int(out)
    if script.startswith("exec "):  # wait until it is what it execs (not bash any more)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                break
            if argv0 not in (b"bash", b"setsid"):
                break
            time.sleep(0.01)
    return pid


def _running(pid: int, since: str) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2:].split()
    return fields[19] == since and fields[0] != "Z"


@pytest.fixture
def fake_state():
    cluster_id = secrets.token_hex(4)
    state = Path(f"/tmp/fk8s.{cluster_id}")
    state.mkdir(mode=0o700)
    (state / "pids").mkdir()
    (state / "id").write_text(cluster_id + "\n")
    started: list[tuple[int, str]] = []
    yield state, cluster_id, started
    for pid, since in started:  # only if the test failed: end what it started
        if _running(pid, since):
            os.kill(pid, 9)
    shutil.rmtree(state, ignore_errors=True)


def test_stop_ends_recorded_servers_and_everything_else_of_the_cluster(fake_state):
    state, cluster_id, started = fake_state
    # "servers" recorded as start.sh records them ("PID STARTTIME"), one ignoring SIGTERM
    servers = {"apiserver": f"exec -a {state}/fake-apiserver sleep 300",
               "scheduler": f"trap '' TERM; exec -a {state}/fake-scheduler sleep 301"}
    for name, script in servers.items():
        pid = _detached(state, script)
        since = _start_time(pid)
        started.append((pid, since))
        (state / "pids" / name).write_text(f"{pid} {since}\n")
    # not recorded, runs outside the state dir but names a path in it (as a containerd
    # shim does)
    shim = shlex.quote(f"exec -a {state}/x/fake-shim sleep 302")
    stray = int(subprocess.run(
        ["bash", "-c", f"( cd / && exec setsid bash -c {shim} >/dev/null 2>&1 </dev/null ) & "
                       "echo $!"], check=True, stdout=subprocess.PIPE, text=True).stdout)
    started.append((stray, _start_time(stray)))
    engine = _engine()
    # the test engine's own helper (tests/engines), not fiber's
    recorded = engine._recorded(str(state))
    assert set(recorded) == {"apiserver", "scheduler"}
    before = engine.leftovers(str(state), cluster_id, recorded)
    assert len([item for item in before if item.startswith("pid ")]) == 3, before

    began = time.monotonic()
    # (a SIGTERM-to-SIGKILL wait of 2 s instead of 10 s keeps the test short)
    proc = subprocess.run(["bash", str(SCRIPTS / "stop.sh"), str(state)],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "FK8S_TERM_WAIT": "2"})
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - began < 30
    assert "scheduler (pid" in proc.stderr and "SIGKILL" in proc.stderr  # it ignored TERM
    assert "fake-shim" in proc.stderr  # the sweep named what it ended
    for pid, since in started:
        assert not _running(pid, since), f"pid {pid} survived stop.sh"
    assert not state.exists()
    assert engine.leftovers(str(state), cluster_id, recorded) == []


def test_leftover_check_names_a_live_process_of_the_cluster(fake_state):
    state, cluster_id, started = fake_state
    pid = _detached(state, f"exec -a {state}/fake-etcd sleep 303")
    since = _start_time(pid)
    started.append((pid, since))
    engine = _engine()
    left = engine.leftovers(str(state), cluster_id, {"etcd": (pid, since)})
    assert f"etcd (pid {pid})" in left
    assert f"pid {pid}: {state}/fake-etcd 303" in left
    assert f"state dir {state}" in left


def test_stop_refuses_a_directory_that_is_no_cluster(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPTS / "stop.sh"), str(tmp_path)],
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 1
    assert "is not a cluster state dir" in proc.stderr


def test_leftover_check_sees_the_whole_running_cluster(k8s_engine):
    """On the session's real cluster: every server start.sh recorded is its own live
    process and the leftover check (the one stop() runs) finds them all, with dockerd's
    containerd, so an empty check at the end of the session means something."""
    state = k8s_engine["FK8S_TEST_STATE"]
    cluster_id = Path(state, "id").read_text().strip()
    engine = _engine()
    # the test engine's own helper (tests/engines), not fiber's
    recorded = engine._recorded(state)
    assert set(recorded) == {"etcd", "apiserver", "scheduler", "controller-manager",
                             "dockerd", "kubelet"}
    binaries = {"etcd": "etcd", "apiserver": "kube-apiserver", "scheduler": "kube-scheduler",
                "controller-manager": "kube-controller-manager", "dockerd": "dockerd",
                "kubelet": "kubelet"}
    for name, (pid, _since) in recorded.items():
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert Path(command).name == binaries[name], f"{name}: pid {pid} runs {command}"
        assert state in Path(f"/proc/{pid}/cmdline").read_text()
    left = engine.leftovers(state, cluster_id, recorded)
    for name, (pid, _since) in recorded.items():
        assert f"{name} (pid {pid})" in left
        assert any(item.startswith(f"pid {pid}: ") for item in left)
    assert any("containerd --config" in item for item in left), left
