#!/usr/bin/env bash
# Stop the test cluster started by start.sh and remove everything it made: containers,
# processes (by their recorded pids), mounts, cgroups, the veth pair, the network
# namespace and the state directory.  Usage: stop.sh <STATE dir>
set -uo pipefail

STATE="${1:?usage: stop.sh STATE_DIR}"
STATE="${STATE%/}"
[[ -d "$STATE" && -f "$STATE/id" ]] || { echo "stop.sh: $STATE is not a cluster state dir" >&2; exit 1; }
ID=$(cat "$STATE/id")

HERE="$(cd "$(dirname "$0")" && pwd)"
cd /
start_time() {  # start_time PID: the process's start time (field 22 of /proc/PID/stat)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo "${20}"
}
recorded() {  # recorded NAME: the pid in pids/NAME if that process is still the one started
    local file="$STATE/pids/$1" pid since
    [[ -f "$file" ]] || return 1
    read -r pid since <"$file" || true
    [[ -n "$pid" && -n "$since" && "$(start_time "$pid")" == "$since" ]] && echo "$pid"
}
# every live process of the cluster (by command line or cgroup; see procs.py)
survivors() { python3 "$HERE/procs.py" "$STATE" | cut -d' ' -f1; }
alive() {  # alive PID: running (a zombie is not)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ "${stat:0:1}" != Z ]]
}
# seconds a server gets between SIGTERM and SIGKILL (FK8S_TERM_WAIT overrides; tests)
wait_of() { echo "${FK8S_TERM_WAIT:-$1}"; }
stop_pid() {  # stop_pid NAME SECONDS: SIGTERM the recorded process, SIGKILL after SECONDS
    local pid began=$SECONDS
    if pid=$(recorded "$1"); then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq $(($2 * 10))); do alive "$pid" || break; sleep 0.1; done
        if alive "$pid"; then
            echo "stop.sh: $1 (pid $pid) did not end within $2 s of SIGTERM: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null
        fi
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        echo "stop.sh: $1 (pid $pid) ended in $((SECONDS - began)) s" >&2
    fi
}

stop_pid kubelet "$(wait_of 10)"
if [[ -S "$STATE/docker.sock" ]] && recorded dockerd >/dev/null; then
    export DOCKER_HOST="unix://$STATE/docker.sock"
    ids=$(timeout 20 docker ps -aq 2>/dev/null)
    # shellcheck disable=SC2086
    [[ -n "$ids" ]] && timeout 60 docker rm -f $ids >/dev/null 2>&1
fi
stop_pid dockerd "$(wait_of 20)"
for name in controller-manager scheduler apiserver etcd; do stop_pid "$name" "$(wait_of 10)"; done

# anything of ours still alive (containers whose dockerd failed, shims, a server that
# was started but not recorded): SIGTERM, then SIGKILL
left=$(survivors)
if [[ -n "$left" ]]; then
    echo "stop.sh: ending processes of the cluster left after its servers stopped:" >&2
    python3 "$HERE/procs.py" "$STATE" >&2
    # shellcheck disable=SC2086
    kill -TERM $left 2>/dev/null
    for pid in $left; do
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
    done
    for pid in $left; do
        for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    done
fi
left=$(survivors)

# mounts made by the kubelet (secret volumes) and docker (overlays), deepest first
grep -F " $STATE" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
# cgroups of the containers (docker's --cgroup-parent)
for dir in /sys/fs/cgroup/*/"fk8s-$ID"; do
    [[ -d "$dir" ]] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null
done
# the kubelet's pod log links (only when this cluster ran a kubelet)
if [[ -f "$STATE/pids/kubelet" ]]; then
    # fixed paths in /var/log that lead into our state dir
    for dir in /var/log/pods/*/; do
        [[ -d "$dir" ]] || continue
        # ours: only links into our state dir (or dangling ones) and no files of its own
        find "$dir" -type f | grep -q . && continue
        foreign=$(find "$dir" -type l ! -lname "$STATE/*" -exec test -e {} \; -print | head -n1)
        [[ -z "$foreign" ]] && rm -rf "$dir"
    done
    for link in /var/log/containers/*.log; do
        [[ -L "$link" && ! -e "$link" ]] && [[ "$(readlink "$link")" == /var/log/pods/* ]] && rm -f "$link"
    done
    rmdir /var/log/pods /var/log/containers 2>/dev/null
fi
[[ -f "$STATE/veth" ]] && ip link del "$(cat "$STATE/veth")" 2>/dev/null
[[ -f "$STATE/netns" ]] && ip netns del "$(cat "$STATE/netns")" 2>/dev/null
if [[ -n "$left" ]]; then
    echo "stop.sh: FAILED: processes of cluster $ID are still alive:" >&2
    python3 "$HERE/procs.py" "$STATE" >&2
    exit 1
fi
rm -rf "$STATE"
echo "stopped test cluster $ID" >&2
