"""The processes of one test cluster (started by start.sh), found in /proc.

A process belongs to the cluster whose state dir is STATE (id ID) when it has no
controlling terminal (start.sh detaches everything it starts) and either its command
line names a path in STATE (every server, dockerd's containerd and the containerd shims)
or its cgroup is under the cluster's ``fk8s-ID`` parent (the pods' containers). So a
person's ``tail -f STATE/logs/...`` in a terminal is not taken for the cluster's. Zombies
are not counted (they run nothing; their parent reaps them).

Usage: procs.py STATE   -> one "PID COMMAND LINE" per line (not this script's callers)
stop.sh uses it to find what is left; tests/engines/kubernetes.py to check that nothing is.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2:].split()  # fields from the 3rd (state) on


def ancestors(pid: int) -> set[int]:
    """``pid`` and every process above it."""
    seen = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        try:
            pid = int(_stat_fields(pid)[1])
        except (OSError, ValueError, IndexError):
            break
    return seen


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (tells a process from a later one with its pid)."""
    try:
        return _stat_fields(pid)[19]
    except (OSError, IndexError):
        return None


def running(pid: int, since: str) -> bool:
    """Whether the process ``pid`` that started at ``since`` still runs (not a zombie)."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return False
    return fields[19] == since and fields[0] != "Z"


def cluster_processes(state: str, cluster_id: str, exclude: set[int] = frozenset(),
                      ) -> list[tuple[int, str]]:
    """(pid, command line) of every live process of the cluster in ``state``."""
    state = state.rstrip("/")
    cgroup = f"/fk8s-{cluster_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        pid = int(entry.name)
        try:
            fields = _stat_fields(pid)
            if fields[0] == "Z" or fields[4] != "0":  # a zombie; a terminal's process
                continue
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ours = (any(arg.decode(errors="replace").find(state + "/") >= 0 for arg in args)
                    or cgroup in Path(f"/proc/{pid}/cgroup").read_bytes())
        except (OSError, IndexError):
            continue  # ended meanwhile
        if ours:
            found.append((pid, b" ".join(args).decode(errors="replace").strip()))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state")
    args = parser.parse_args()
    cluster_id = Path(args.state, "id").read_text().strip()
    exclude = ancestors(os.getpid())  # this script and its callers (stop.sh, start.sh)
    for pid, command in cluster_processes(args.state, cluster_id, exclude):
        print(pid, command)


if __name__ == "__main__":
    main()
