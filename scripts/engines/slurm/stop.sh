#!/usr/bin/env bash
# Stop the test cluster started by start.sh in STATE_DIR and remove STATE_DIR.
#
# usage: stop.sh STATE_DIR
#
# Cancels every job of that cluster, waits for them to end, stops slurmd, slurmctld
# and munged (the latter only if start.sh started it) by the pids start.sh recorded,
# kills any process still carrying that cluster's SLURM_CONF (job steps) by pid, and
# removes the directory.
set -uo pipefail

state=${1:?usage: stop.sh STATE_DIR}
[ -d "$state" ] || exit 0
export SLURM_CONF=$state/slurm.conf

log() { echo "slurm-engine: $*" >&2; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

pid_of() { cat "$state/pids/$1.pid" 2>/dev/null; }

stop_pid() {  # stop_pid NAME: SIGTERM, wait up to 10 s, then SIGKILL
    local pid
    pid=$(pid_of "$1")
    alive "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do alive "$pid" || return 0; sleep 0.1; done
    log "$1 ($pid) ignored SIGTERM; killing it"
    kill -KILL "$pid" 2>/dev/null
}

# processes of this cluster (daemons and job steps inherit SLURM_CONF=$state/slurm.conf)
cluster_pids() {
    local environ pid
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}; pid=${pid%/environ}
        [ "$pid" = "$$" ] && continue
        if tr '\0' '\n' 2>/dev/null <"$environ" | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
            echo "$pid"
        fi
    done
}

if alive "$(pid_of slurmctld)"; then
    scancel --full --signal=KILL --state=RUNNING -u "$(id -un)" 2>/dev/null
    scancel -u "$(id -un)" 2>/dev/null
    for _ in $(seq 100); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
    done
fi
stop_pid slurmd
stop_pid slurmctld
stop_pid munged
for pid in $(cluster_pids); do
    log "killing leftover process $pid ($(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null))"
    kill -KILL "$pid" 2>/dev/null
done
rm -rf "$state"
