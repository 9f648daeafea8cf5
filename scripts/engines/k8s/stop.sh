#!/usr/bin/env bash
# Stop the test cluster started by start.sh and remove everything it made: containers,
# processes (by their recorded pids), mounts, cgroups, the veth pair, the network
# namespace and the state directory.  Usage: stop.sh <STATE dir>
set -uo pipefail

STATE="${1:?usage: stop.sh STATE_DIR}"
[[ -d "$STATE" && -f "$STATE/id" ]] || { echo "stop.sh: $STATE is not a cluster state dir" >&2; exit 1; }
ID=$(cat "$STATE/id")

alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }
stop_pid() {  # stop_pid NAME SECONDS: SIGTERM the recorded pid, SIGKILL after SECONDS
    local file="$STATE/pids/$1" pid
    [[ -f "$file" ]] || return 0
    pid=$(cat "$file")
    # only a process that still is ours: its command line mentions our state dir or id
    if alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -e "$STATE" -e "fk8s"; then
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq $(($2 * 10))); do alive "$pid" || break; sleep 0.1; done
        alive "$pid" && kill -KILL "$pid" 2>/dev/null
        for _ in $(seq 20); do alive "$pid" || break; sleep 0.1; done
    fi
    rm -f "$file"
}

stop_pid kubelet 10
if [[ -S "$STATE/docker.sock" ]]; then
    export DOCKER_HOST="unix://$STATE/docker.sock"
    ids=$(timeout 20 docker ps -aq 2>/dev/null)
    [[ -n "$ids" ]] && timeout 60 docker rm -f $ids >/dev/null 2>&1
fi
stop_pid dockerd 20
for name in controller-manager scheduler apiserver etcd; do stop_pid "$name" 10; done

# mounts made by the kubelet (secret volumes) and docker (overlays), deepest first
grep -F " $STATE" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
# cgroups of the containers (docker's --cgroup-parent)
for dir in /sys/fs/cgroup/*/"fk8s-$ID"; do
    [[ -d "$dir" ]] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null
done
# the kubelet's pod log links (fixed paths in /var/log) that lead into our state dir
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
[[ -f "$STATE/veth" ]] && ip link del "$(cat "$STATE/veth")" 2>/dev/null
[[ -f "$STATE/netns" ]] && ip netns del "$(cat "$STATE/netns")" 2>/dev/null
rm -rf "$STATE"
echo "stopped test cluster $ID" >&2
