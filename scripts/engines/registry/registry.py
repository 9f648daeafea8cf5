"""A container registry for the tests of ``fiber build``: Debian's ``docker-registry``.

:func:`start` installs the package if it is missing (``install.sh``), writes a
configuration into a private temporary directory (``/tmp/freg.*``: the blobs, the
configuration and the log) and starts ``docker-registry serve`` on ``127.0.0.1:PORT``,
in this machine's network namespace or, with ``netns``, in a test cluster's (the
Kubernetes test node's engine pulls from its own 127.0.0.1). Docker engines treat a
registry on 127.0.0.0/8 as insecure (plain HTTP) without any configuration. With
``readonly`` the registry refuses every push (its maintenance mode): the tests of a
refused push. :func:`stop` ends it by its pid, removes its directory and says whether
anything was left. :func:`requests` reads its access log: which blobs and manifests
were uploaded or fetched, what the tests assert on.

Command line: ``python registry.py start`` prints the state as JSON (the registry
keeps running); ``python registry.py stop STATE_JSON_FILE``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PREFIX = "freg."
SYSTEM_PATH = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_REQUEST = re.compile(r'http\.request\.method=(\w+) .*?http\.request\.uri="?([^"\s]+)"?'
                      r'.*?http\.response\.status=(\d+)')


def ensure_installed() -> str:
    """The path of docker-registry, installing Debian's package first if needed."""
    found = shutil.which("docker-registry", path=SYSTEM_PATH)
    if found is None:
        subprocess.run(["bash", str(HERE / "install.sh")], check=True, stdin=subprocess.DEVNULL)
        found = shutil.which("docker-registry", path=SYSTEM_PATH)
    if found is None:
        raise RuntimeError("docker-registry is still missing after installing it")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(directory: Path, port: int, readonly: bool) -> str:
    maintenance = ("  maintenance:\n    readonly:\n      enabled: true\n" if readonly else "")
    return (
        "version: 0.1\n"
        "log:\n  level: info\n  accesslog:\n    disabled: true\n"
        "storage:\n"
        f"  filesystem:\n    rootdirectory: {directory / 'data'}\n"
        "  delete:\n    enabled: true\n"
        + maintenance +
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: {os.urandom(16).hex()}\n"
    )


def start(netns: str | None = None, readonly: bool = False, timeout: float = 30) -> dict:
    """Start a registry; its state (``address``, ``pid``, ``dir``, ``log``...)."""
    binary = ensure_installed()
    directory = Path(tempfile.mkdtemp(prefix=PREFIX, dir="/tmp"))
    # in a namespace of its own any port is free; here, ask the kernel for one
    port = _free_port() if netns is None else 20000 + int.from_bytes(os.urandom(2)) % 20000
    (directory / "config.yml").write_text(_config(directory, port, readonly))
    command = [binary, "serve", str(directory / "config.yml")]
    if netns is not None:
        command = ["nsenter", f"--net=/var/run/netns/{netns}", *command]
    log = directory / "registry.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PATH": SYSTEM_PATH})
    state = {"address": f"127.0.0.1:{port}", "pid": proc.pid, "dir": str(directory),
             "log": str(log), "netns": netns, "readonly": readonly}
    (directory / "state.json").write_text(json.dumps(state))
    deadline = time.monotonic() + timeout
    while f"listening on 127.0.0.1:{port}" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-2000:]
            stop(state)
            raise RuntimeError(f"docker-registry did not start on 127.0.0.1:{port}:\n{text}")
        time.sleep(0.05)
    state["proc"] = proc
    return state


def _ours(pid: int, directory: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return directory.encode() in handle.read()
    except OSError:
        return False


def stop(state: dict, timeout: float = 15) -> list[str]:
    """End the registry and remove its directory; what was left (a process that did
    not end, a directory that could not be removed), empty when all is gone."""
    pid, directory = int(state["pid"]), state["dir"]
    proc = state.get("proc")
    left = []
    if _ours(pid, directory):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _ours(pid, directory) and time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.05)
        if _ours(pid, directory):
            os.kill(pid, signal.SIGKILL)
            left.append(f"docker-registry pid {pid} did not end on SIGTERM")
    if proc is not None:
        proc.wait(10)
    shutil.rmtree(directory, ignore_errors=True)
    if os.path.exists(directory):
        left.append(f"{directory} could not be removed")
    return left


def requests(state: dict) -> list[tuple[str, str, int]]:
    """``(method, path, status)`` of every request the registry answered so far."""
    text = Path(state["log"]).read_text(errors="replace")
    return [(m.group(1), m.group(2), int(m.group(3))) for m in _REQUEST.finditer(text)]


def blob_uploads(state: dict) -> int:
    """How many blobs (layers and image configurations) were uploaded."""
    return len(uploaded(state))


def uploaded(state: dict) -> list[str]:
    """The digests of the blobs uploaded so far, in order (one per completed upload)."""
    found = []
    for method, path, status in requests(state):
        if method == "PUT" and "/blobs/uploads/" in path and status < 300:
            match = re.search(r"digest=sha256(?:%3A|:)([0-9a-f]{64})", path)
            found.append(match.group(1)[:12] if match else path)
    return found


def tags(state: dict, repository: str) -> list[str]:
    """The tags of ``repository`` the registry holds (from its storage)."""
    tags_dir = (Path(state["dir"]) / "data" / "docker" / "registry" / "v2" / "repositories"
                / repository / "_manifests" / "tags")
    return sorted(p.name for p in tags_dir.iterdir()) if tags_dir.is_dir() else []


def main() -> None:
    if sys.argv[1:2] == ["start"]:
        state = start()
        state.pop("proc")
        sys.stdout.write(json.dumps(state) + "\n")
    elif sys.argv[1:2] == ["stop"] and len(sys.argv) == 3:
        left = stop(json.loads(Path(sys.argv[2]).read_text()))
        sys.exit("\n".join(left) or None)
    else:
        sys.exit("usage: registry.py start | stop STATE_JSON_FILE")


if __name__ == "__main__":
    main()
