"""The Docker engine the docker backend is tested against: a private ``dockerd``.

:func:`start` installs Debian's docker.io if ``dockerd`` is missing (``install.sh``),
starts a ``dockerd`` of its own (no default bridge, no iptables: containers use the
host's network, all traffic stays on loopback) with its socket, exec-root and pidfile in
a short temporary directory, builds or reuses the test image (``build_image.py``) and
returns the FIBER_* settings for the tests. :func:`stop` removes every container with
fiber labels, stops that ``dockerd`` by its pid (and any containerd or shim it left),
removes the temporary directory and raises if containers were left behind.

The engine's data-root (which holds the cached test image) is
``${FIBER_CACHE_DIR:-/var/cache/fiber}/docker/data-root``, locked with flock for the
lifetime of the dockerd (the lock's file descriptor is inherited by dockerd); a second
concurrent session gets a temporary data-root and builds its own image.

Every engine's directory holds ``engine.json`` naming the test process that owns it;
:func:`start` first stops engines whose owner is gone (sessions killed before stop()).

The image does not contain the editable installs (fiber-core, fiber-docker, ...):
their source directories are bind-mounted read-only at the same paths through the
``docker_volumes`` setting returned by :func:`start`.

Command line: ``python engine.py start`` (prints the settings as JSON and leaves the
engine running; state in ``$FIBER_CACHE_DIR/docker/engine.json``) and
``python engine.py stop``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import build_image  # noqa: E402

logger = logging.getLogger("fiber.docker.engine")

FIBER_LABEL = "fiber.run"
RUN_PREFIX = "fdk."
# dockerd finds containerd, runc and docker-init on its PATH (in /usr/sbin on Debian).
SYSTEM_PATH = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATE_FILE = "engine.json"
# How long stop() waits for the tests' containers to be released before it calls
# them left behind.
GRACE_SECONDS = 15


def cache_dir() -> Path:
    return Path(os.environ.get("FIBER_CACHE_DIR") or "/var/cache/fiber") / "docker"


def _which_dockerd() -> str | None:
    return shutil.which("dockerd", path=SYSTEM_PATH)


def ensure_installed() -> str:
    """The path of dockerd, installing docker.io first if needed."""
    if _which_dockerd() is None:
        logger.info("dockerd is missing: installing docker.io")
        subprocess.run(["bash", str(HERE / "install.sh")], check=True, stdin=subprocess.DEVNULL)
    path = _which_dockerd()
    if path is None:
        raise RuntimeError("dockerd is still missing after installing docker.io")
    return path


def _client(socket: str, timeout: float = 60):
    import docker

    return docker.DockerClient(base_url=f"unix://{socket}", version="auto", timeout=timeout)


def _wait_ready(proc: subprocess.Popen, socket: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dockerd exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if os.path.exists(socket):
            try:
                client = _client(socket, 5)
                client.ping()
                client.close()
                return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
        time.sleep(0.1)
    raise RuntimeError(f"dockerd did not answer within {timeout}s:\n{log.read_text()[-3000:]}")


def _lock_data_root(cache: Path) -> tuple[int | None, Path | None]:
    """Lock the cached data-root; (fd, path) or (None, None) when another dockerd has it."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache / "data-root.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        logger.warning("cannot use the cache dir %s (%s): using a temporary data-root", cache, exc)
        return None, None
    deadline = time.monotonic() + 5  # an engine being stopped may still hold it
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, cache / "data-root"
        except BlockingIOError:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    os.close(fd)
    logger.warning("the cached data-root is in use by another engine: using a temporary one")
    return None, None


def _remove_fiber_containers(client) -> list[str]:
    """Remove every container with fiber labels; return their names."""
    names = []
    for row in client.api.containers(all=True, filters={"label": FIBER_LABEL}):
        names.append((row.get("Names") or [row["Id"][:12]])[0].lstrip("/"))
        try:
            client.api.remove_container(row["Id"], force=True, v=True)
        except Exception as exc:  # noqa: BLE001 - keep cleaning, report below
            logger.warning("cannot remove container %s: %s", names[-1], exc)
    return names


def start(python: str = sys.executable) -> tuple[dict[str, str], dict]:
    """Start the engine and build the image; return (settings, state for stop)."""
    dockerd = ensure_installed()
    started = time.monotonic()
    stop_abandoned()
    run_dir = Path(tempfile.mkdtemp(prefix=RUN_PREFIX, dir="/tmp"))
    socket = str(run_dir / "docker.sock")
    lock_fd, data_root = _lock_data_root(cache_dir())
    temp_root = data_root is None
    if data_root is None:
        data_root = run_dir / "data"
    log = run_dir / "dockerd.log"
    proc = _launch(dockerd, run_dir, data_root, lock_fd)
    state = {"pid": proc.pid, "run_dir": str(run_dir), "socket": socket,
             "data_root": str(data_root), "temp_data_root": temp_root, "owner": os.getpid()}
    (run_dir / STATE_FILE).write_text(json.dumps(state))
    try:
        _wait_ready(proc, socket, log)
        ready = time.monotonic() - started
        client = _client(socket)
        stale = _remove_fiber_containers(client)
        if stale:
            logger.warning("removed containers left by an earlier session: %s", stale)
        tag = build_image.build(client, python, workdir=str(run_dir))
        info = build_image.probe(python)
        client.close()
    except BaseException:
        stop(state, check=False, proc=proc)
        raise
    state["proc"] = proc
    volumes = [f"{root}:{root}:ro" for root in _source_roots(info)]
    logger.info("docker engine ready in %.1fs, image %s after %.1fs", ready, tag,
                time.monotonic() - started)
    settings = {"FIBER_IMAGE": tag, "FIBER_DOCKER_HOST": f"unix://{socket}",
                "FIBER_DOCKER_VOLUMES": ",".join(volumes)}
    return settings, state


def _launch(dockerd: str, run_dir: Path, data_root: Path, lock_fd: int | None,
            ) -> subprocess.Popen:
    """Start the engine's dockerd (its output appended to ``dockerd.log``); it inherits
    the data-root's lock, if any, and holds it from then on."""
    socket = run_dir / "docker.sock"
    with open(run_dir / "dockerd.log", "ab") as out:
        proc = subprocess.Popen(
            [dockerd, "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip-forward=false",
             "--data-root", str(data_root), "--exec-root", str(run_dir / "x"),
             "--host", f"unix://{socket}", "--pidfile", str(run_dir / "docker.pid")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": SYSTEM_PATH}, start_new_session=True,
            pass_fds=() if lock_fd is None else (lock_fd,),
        )
    if lock_fd is not None:
        os.close(lock_fd)  # dockerd holds the lock from now on
    return proc


def restart(state: dict, down_seconds: float = 5.0) -> None:
    """Restart the engine's dockerd as an administrator's ``systemctl restart docker``
    would, for the fault tests: SIGTERM (it stops its running containers, as a daemon
    without live-restore does), ``down_seconds`` with no daemon (its socket refuses
    connections), then the same dockerd again on the same data-root, whose containers
    it still lists (exited). ``state`` gets the new pid and process."""
    run_dir = Path(state["run_dir"])
    _end(state["pid"], str(run_dir), state.get("proc"), 60)
    for pid in _pids_mentioning(str(run_dir)):  # its containerd, if it outlived it
        _end(pid, str(run_dir), None, 10)
    time.sleep(down_seconds)
    if state.get("temp_data_root"):
        lock_fd = None
    else:
        lock_fd, locked = _lock_data_root(cache_dir())
        if locked is None:
            raise RuntimeError("the cached data-root was taken while dockerd restarted")
    proc = _launch(ensure_installed(), run_dir, Path(state["data_root"]), lock_fd)
    state["pid"], state["proc"] = proc.pid, proc
    saved = {k: v for k, v in state.items() if k != "proc"}
    (run_dir / STATE_FILE).write_text(json.dumps(saved))
    _wait_ready(proc, str(run_dir / "docker.sock"), run_dir / "dockerd.log")


def stop_abandoned() -> None:
    """Stop the engines of earlier sessions whose test process is gone (a session
    that was killed before its stop() ran)."""
    for run_dir in Path("/tmp").glob(RUN_PREFIX + "*"):
        try:
            state = json.loads((run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            continue
        owner = int(state.get("owner", 0))
        if owner <= 0 or _alive(owner):  # 0: started from the command line, kept
            continue
        logger.warning("stopping the docker engine of an ended session in %s", run_dir)
        stop(state, check=False)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _source_roots(info: dict) -> list[str]:
    """What to mount read-only into test containers: the repository holding the
    editable installs, and any editable source outside it."""
    repo = str(HERE.parents[2])
    roots = [repo]
    for root in build_image.editable_roots(info):
        if not (root == repo or root.startswith(repo + "/")):
            roots.append(root)
    return roots


def _ours(pid: int, marker: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return marker.encode() in handle.read()
    except OSError:
        return False


def _pids_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _ours(int(entry), marker):
            pids.append(int(entry))
    return pids


def _end(pid: int, marker: str, proc: subprocess.Popen | None, timeout: float) -> None:
    if not _ours(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        if proc is None and not _ours(pid, marker):
            return
        time.sleep(0.1)
    if _ours(pid, marker):
        logger.warning("pid %d did not stop on SIGTERM: killing it", pid)
        os.kill(pid, signal.SIGKILL)
    if proc is not None:
        proc.wait(10)


def stop(state: dict, check: bool = True, proc: subprocess.Popen | None = None) -> None:
    """Tear down what :func:`start` made. With ``check``, raise afterwards if
    containers with fiber labels were still there."""
    run_dir, socket = state["run_dir"], state["socket"]
    proc = proc or state.get("proc")
    leftovers: list[str] = []
    try:
        if os.path.exists(socket):
            client = _client(socket, 30)
            if check:  # the core releases ended jobs asynchronously: give it a moment
                deadline = time.monotonic() + GRACE_SECONDS
                while (client.api.containers(all=True, filters={"label": FIBER_LABEL})
                       and time.monotonic() < deadline):
                    time.sleep(0.25)
            leftovers = _remove_fiber_containers(client)
            client.close()
    except Exception as exc:  # noqa: BLE001 - the engine may be gone already
        logger.warning("cannot clean containers: %s", exc)
    _end(state["pid"], run_dir, proc, 30)
    for pid in _pids_mentioning(run_dir):  # containerd or shims dockerd left behind
        _end(pid, run_dir, None, 10)
    with open("/proc/mounts") as handle:
        mounts = [line.split()[1] for line in handle]
    prefixes = (run_dir + "/", state["data_root"] + "/")
    for mount in sorted((m for m in mounts if m.startswith(prefixes)), reverse=True):
        subprocess.run(["umount", "-l", mount], check=False)
    shutil.rmtree(run_dir, ignore_errors=True)
    if check and leftovers:
        raise RuntimeError(f"containers were left behind by the tests: {', '.join(leftovers)}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    state_file = cache_dir() / "engine.json"
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "start":
        settings, state = start()
        state.pop("proc", None)
        state["owner"] = 0
        (Path(state["run_dir"]) / STATE_FILE).write_text(json.dumps(state))
        state_file.write_text(json.dumps(state))
        sys.stdout.write(json.dumps(settings, indent=1) + "\n")
    elif command == "stop":
        if state_file.exists():
            stop(json.loads(state_file.read_text()), check=False)
            state_file.unlink()
    else:
        sys.exit("usage: engine.py start|stop")


if __name__ == "__main__":
    main()
