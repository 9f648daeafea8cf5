"""The slurm backend's test engine: a one-node Slurm cluster (munged, slurmctld,
slurmd) on loopback ports, started by scripts/engines/slurm/start.sh in a private
temporary directory and torn down by scripts/engines/slurm/stop.sh.

``start()`` returns SLURM_CONF (the generated slurm.conf) and the FIBER_SLURM_*
settings of the tests; ``stop()`` cancels every job, stops the daemons by pid and
removes the directory.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "engines" / "slurm"
PARTITION = "fiber"

_state: str | None = None


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def start() -> dict[str, str]:
    global _state
    state = tempfile.mkdtemp(prefix="fiber-slurm-")
    ctld_port, slurmd_port = _free_ports(2)
    started = time.monotonic()
    try:
        subprocess.run(["bash", str(SCRIPTS / "start.sh"), state, str(ctld_port),
                        str(slurmd_port)], check=True, stdin=subprocess.DEVNULL)
    except BaseException:
        subprocess.run(["bash", str(SCRIPTS / "stop.sh"), state], check=False)
        raise
    _state = state
    os.makedirs(os.path.join(state, "joblogs"), exist_ok=True)
    print(f"slurm engine started in {time.monotonic() - started:.1f}s ({state})")
    return {
        "SLURM_CONF": os.path.join(state, "slurm.conf"),
        "FIBER_SLURM_PARTITION": PARTITION,
        "FIBER_SLURM_LOG_DIR": os.path.join(state, "joblogs"),
        "FIBER_SLURM_POLL_INTERVAL": "0.2",
    }


def stop() -> None:
    global _state
    if _state is None:
        return
    state, _state = _state, None
    subprocess.run(["bash", str(SCRIPTS / "stop.sh"), state], check=False)


def manager_pids() -> list[int]:
    """slurmctld's pid, from the state directory of ``SLURM_CONF``."""
    state = Path(os.environ["SLURM_CONF"]).parent
    return [int((state / "pids" / "slurmctld.pid").read_text())]


# -- an outage of the cluster manager (the fault tests and bench/faults.py) -----------
def freeze() -> None:
    """Take the cluster manager away: SIGSTOP slurmctld (found from the settings in the
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


# -- a node whose slurmd does not answer (a batch step that has not launched yet) -----
def freeze_node() -> None:
    """SIGSTOP the node's slurmd: slurmctld still allocates jobs (and lists them
    RUNNING) but their batch steps cannot launch until ``thaw_node()``."""
    state = Path(os.environ["SLURM_CONF"]).parent
    os.kill(int((state / "pids" / "slurmd.pid").read_text()), signal.SIGSTOP)


def thaw_node() -> None:
    """SIGCONT the node's slurmd (harmless when it runs)."""
    state = Path(os.environ["SLURM_CONF"]).parent
    try:
        os.kill(int((state / "pids" / "slurmd.pid").read_text()), signal.SIGCONT)
    except ProcessLookupError:
        pass
