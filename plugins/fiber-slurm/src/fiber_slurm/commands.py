"""Running Slurm's client commands (sbatch, squeue, scancel, scontrol).

Every call goes through :class:`SlurmCommands`, which finds the executables (on PATH
or in ``slurm_bin_dir``), runs them without a shell, and turns "no Slurm here" and
"controller unreachable" into :class:`fiber.backend.ClusterUnreachableError` with a
message that says what to do.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from fiber.backend import ClusterUnreachableError

logger = logging.getLogger("fiber.slurm")

# stderr fragments that mean slurmctld (or its configuration) cannot be reached
_UNREACHABLE = (
    "unable to contact slurm controller",
    "could not establish a configuration source",
    "socket timed out",
    "zero bytes were transmitted or received",
    "connection refused",
    "communication connection failure",
    "unable to establish controller machine",
)


def is_unreachable(stderr: str) -> bool:
    text = stderr.lower()
    return any(fragment in text for fragment in _UNREACHABLE)


class SlurmCommands:
    """Finds and runs Slurm's commands. ``bin_dir`` overrides the PATH search."""

    def __init__(self, bin_dir: str | None = None, timeout: float = 60.0) -> None:
        self.bin_dir = bin_dir
        self.timeout = timeout
        self._paths: dict[str, str] = {}

    def path(self, name: str) -> str:
        """The executable of command ``name``; raises ClusterUnreachableError if absent."""
        found = self._paths.get(name)
        if found:
            return found
        search = self.bin_dir if self.bin_dir else os.environ.get("PATH", os.defpath)
        found = shutil.which(name, path=search)
        if not found:
            where = (f"in slurm_bin_dir {self.bin_dir!r}" if self.bin_dir
                     else "on PATH")
            raise ClusterUnreachableError(
                f"the Slurm command {name!r} was not found {where}: the slurm backend needs "
                "Slurm's client commands (sbatch, squeue, scancel, scontrol). Install them "
                "(e.g. apt-get install slurm-client, or load your site's slurm module) and "
                "put their directory on PATH, or set FIBER_SLURM_BIN_DIR to it.",
                transient=False)
        self._paths[name] = found
        return found

    def run(self, name: str, args: list[str], stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``name args`` (with ``env`` as its environment if given, else this
        process's) and return the finished process (text mode). Raises
        ClusterUnreachableError when the command is missing, hangs, or cannot reach
        slurmctld; other failures are left to the caller (``returncode != 0``)."""
        argv = [self.path(name), *args]
        logger.debug("running %s", " ".join(argv))
        try:
            done = subprocess.run(
                argv, input=stdin, capture_output=True, text=True, timeout=self.timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL, env=env,
            )
        except subprocess.TimeoutExpired:
            raise ClusterUnreachableError(
                f"{name} did not answer within {self.timeout:.0f}s: is slurmctld up and "
                "reachable from this host? (check `scontrol ping`)"
            ) from None
        except OSError as exc:
            raise ClusterUnreachableError(f"cannot run {argv[0]}: {exc}") from exc
        if done.returncode != 0 and is_unreachable(done.stderr):
            raise ClusterUnreachableError(
                f"{name} cannot reach the Slurm controller: {done.stderr.strip()} -- check "
                "that slurmctld runs and that SLURM_CONF (or /etc/slurm/slurm.conf) "
                "describes this cluster (`scontrol ping`)."
            )
        return done
