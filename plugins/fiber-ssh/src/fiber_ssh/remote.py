"""What runs on the host: the small ``/bin/sh`` wrapper that starts a job.

The remote command line is ``exec /bin/sh -c WRAPPER fiber-ssh-job END CWD ARGV...``;
it holds no secret. The job's environment and its secrets (``JobSpec.secrets``: the run's secret) are sent on
the channel's **stdin** as ``export NAME='value'`` lines ended by the random line END;
the wrapper reads them with ``read`` and ``eval``s them, so the values never appear on
a command line (``ps``) nor in a file. The wrapper then changes to CWD, checks that the
program exists, starts a tiny *signal relay* (a subshell that keeps reading stdin and,
for a line ``TERM`` or ``KILL``, signals the job's process group), prints
``FIBER-SSH-PID <pid>`` and ``exec``s the program with stdin from ``/dev/null`` and
stderr joined to stdout. sshd made the session's first process a session and
process-group leader, and ``exec`` keeps that pid, so ``kill -- -<pid>`` reaches the
job and every process it started. Signalling through the job's own channel needs no
new SSH session (whose login shell may be slow); a second session running
:func:`kill_command` is the fallback.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Mapping, Sequence

PID_MARK = "FIBER-SSH-PID "
ERROR_MARK = "FIBER-SSH-ERROR "

WRAPPER = r"""
_fiber_ssh_end=$1
shift
_fiber_ssh_env=
_fiber_ssh_ok=
while IFS= read -r _fiber_ssh_line; do
  if [ "$_fiber_ssh_line" = "$_fiber_ssh_end" ]; then _fiber_ssh_ok=1; break; fi
  _fiber_ssh_env="$_fiber_ssh_env$_fiber_ssh_line
"
done
[ -n "$_fiber_ssh_ok" ] || { echo "FIBER-SSH-ERROR env the environment did not arrive"; exit 125; }
eval "$_fiber_ssh_env" || { echo "FIBER-SSH-ERROR env the environment could not be set"; exit 125; }
unset _fiber_ssh_env _fiber_ssh_line _fiber_ssh_end _fiber_ssh_ok
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
exec 3<&0
(
  trap '' TERM INT HUP
  while IFS= read -r _fiber_ssh_sig; do
    case $_fiber_ssh_sig in
      TERM|KILL) kill -s "$_fiber_ssh_sig" -- "-$$" 2>/dev/null || kill -s "$_fiber_ssh_sig" "$$" ;;
    esac
  done
) <&3 >/dev/null 2>&1 &
exec 3<&-
echo "FIBER-SSH-PID $$"
exec "$@" </dev/null 2>&1
""".strip()

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def command_line(argv: Sequence[str], cwd: str | None, end: str) -> str:
    """The exec request's command (no secret in it); ``end`` is the line that ends the
    environment on stdin."""
    words = ["exec", "/bin/sh", "-c", WRAPPER, "fiber-ssh-job", end, cwd or "", *argv]
    return " ".join(shlex.quote(word) for word in words)


def new_end_marker() -> str:
    """A line that cannot occur inside the quoted environment."""
    return "FIBER-SSH-ENV-END-" + secrets.token_hex(8)


def env_script(env: Mapping[str, str], end: str = "") -> str:
    """The stdin the wrapper evaluates, ended by the line ``end``. Raises
    ``ValueError`` for a bad name."""
    lines = []
    for name, value in env.items():
        if not _NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not valid in a shell")
        if "\0" in str(value):
            raise ValueError(f"environment variable {name} contains a NUL byte")
        lines.append(f"export {name}={shlex.quote(str(value))}")
    lines.append(end)
    return "\n".join(lines) + "\n"


#: variables the backend adds to every job's environment, so that any process of the
#: same user can find the job on its host (:data:`LIST_SCRIPT`): its id, name and labels
JOB_VAR, NAME_VAR, LABELS_VAR = "_FIBER_SSH_JOB", "_FIBER_SSH_NAME", "_FIBER_SSH_LABELS"
JOB_MARK = "FIBER-SSH-JOB "
LIST_END = "FIBER-SSH-LIST-END"

#: Lists the jobs of this user on the host: processes whose environment this user can
#: read and holds JOB_VAR (one grep over every readable environment), that share the
#: listing shell's network namespace (hosts that are namespaces of one machine see each
#: other's processes) and lead their session (the wrapper's exec'd program; not the
#: processes it forked), checked with shell builtins. For each: a JOB_MARK line with its
#: pid, then its JOB_VAR, NAME_VAR and LABELS_VAR lines.
LIST_SCRIPT = r"""
for f in $(grep -las '_FIBER_SSH_JOB=' /proc/[0-9]*/environ); do
  d=${f%/environ}
  p=${d#/proc/}
  [ "$d/ns/net" -ef /proc/self/ns/net ] || continue
  read -r st < "$d/stat" 2>/dev/null || continue
  st=${st##*) }
  set -- $st
  [ "$4" = "$p" ] || continue
  e=$(tr '\0' '\n' < "$f" 2>/dev/null | grep -E '^_FIBER_SSH_(JOB|NAME|LABELS)=') || continue
  echo "FIBER-SSH-JOB $p"
  echo "$e"
done
echo FIBER-SSH-LIST-END
""".strip()


def parse_listing(text: str) -> list[tuple[int, dict[str, str]]]:
    """``[(pid, {variable: value}), ...]`` from :data:`LIST_SCRIPT`'s output (what a
    login shell printed around it is ignored); raises ``ValueError`` if it did not end."""
    if LIST_END not in text:
        raise ValueError("the job listing did not finish")
    found: list[tuple[int, dict[str, str]]] = []
    for line in text.splitlines():
        if line.startswith(JOB_MARK):
            found.append((int(line[len(JOB_MARK):]), {}))
        elif found and "=" in line:
            name, _, value = line.partition("=")
            if name in (JOB_VAR, NAME_VAR, LABELS_VAR):
                found[-1][1][name] = value
    return [(pid, env) for pid, env in found if JOB_VAR in env]


def alive_command(pid: int, job_id: str) -> str:
    """Prints ``alive`` while process ``pid`` is still job ``job_id``."""
    return (f"grep -qa {shlex.quote(JOB_VAR + '=' + job_id)} /proc/{pid}/environ "
            "2>/dev/null && echo alive; true")


def kill_command(pid: int, force: bool) -> str:
    """Signal the job's process group (and the pid itself, should it have left it)."""
    sig = "KILL" if force else "TERM"
    return f"kill -{sig} -- -{pid} 2>/dev/null; kill -{sig} {pid} 2>/dev/null; true"
