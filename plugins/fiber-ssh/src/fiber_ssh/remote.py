"""What runs on the host: the small ``/bin/sh`` wrapper that starts a job.

The remote command line is ``exec /bin/sh -c WRAPPER fiber-ssh-job CWD ARGV...``; it
holds no secret. The job's environment (which carries the run's secret) is sent on the
channel's **stdin** as ``export NAME='value'`` lines, then stdin is closed; the wrapper
reads it with ``$(cat)`` and ``eval``s it, so the values never appear on a command
line (``ps``) nor in a file. The wrapper then changes to CWD, checks that the program
exists, prints ``FIBER-SSH-PID <pid>`` and ``exec``s the program with stdin from
``/dev/null`` and stderr joined to stdout. sshd made the session's first process a
session and process-group leader, and ``exec`` keeps that pid, so ``kill -- -<pid>``
reaches the job and every process it started.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

PID_MARK = "FIBER-SSH-PID "
ERROR_MARK = "FIBER-SSH-ERROR "

WRAPPER = r"""
_fiber_ssh_env=$(cat) || exit 125
eval "$_fiber_ssh_env" || { echo "FIBER-SSH-ERROR env the environment could not be set"; exit 125; }
unset _fiber_ssh_env
_fiber_ssh_cwd=$1
shift
if [ -n "$_fiber_ssh_cwd" ]; then
  cd -- "$_fiber_ssh_cwd" 2>/dev/null || { echo "FIBER-SSH-ERROR cwd $_fiber_ssh_cwd"; exit 126; }
fi
unset _fiber_ssh_cwd
case $1 in
  */*) if [ ! -f "$1" ] || [ ! -x "$1" ]; then echo "FIBER-SSH-ERROR notfound $1"; exit 127; fi ;;
  *) command -v -- "$1" >/dev/null 2>&1 || { echo "FIBER-SSH-ERROR notfound $1"; exit 127; } ;;
esac
echo "FIBER-SSH-PID $$"
exec "$@" </dev/null 2>&1
""".strip()

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def command_line(argv: Sequence[str], cwd: str | None) -> str:
    """The exec request's command (no secret in it)."""
    words = ["exec", "/bin/sh", "-c", WRAPPER, "fiber-ssh-job", cwd or "", *argv]
    return " ".join(shlex.quote(word) for word in words)


def env_script(env: Mapping[str, str]) -> str:
    """The stdin the wrapper evaluates. Raises ``ValueError`` for a bad name."""
    lines = []
    for name, value in env.items():
        if not _NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid in a shell")
        if "\0" in str(value):
            raise ValueError(f"environment variable {name} contains a NUL byte")
        lines.append(f"export {name}={shlex.quote(str(value))}")
    return "\n".join(lines) + "\n"


def kill_command(pid: int, force: bool) -> str:
    """Signal the job's process group (and the pid itself, should it have left it)."""
    sig = "KILL" if force else "TERM"
    return f"kill -{sig} -- -{pid} 2>/dev/null; kill -{sig} {pid} 2>/dev/null; true"
