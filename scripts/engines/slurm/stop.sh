#!/usr/bin/env bash
# Stop the test cluster started by start.sh in STATE_DIR and remove STATE_DIR.
#
# usage: stop.sh STATE_DIR
#
# Cancels every job of that cluster, waits for them to end, stops slurmd and slurmctld
# by the pids start.sh recorded, and munged if a test engine started it and no other
# test cluster still uses it (see start.sh),
# kills any process still carrying that cluster's SLURM_CONF (job steps) by pid, and
# removes the directory.
set -uo pipefail

state=${1:?usage: stop.sh STATE_DIR}
[ -d "$state" ] || exit 0
conf=$state/slurm.conf

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

# processes of this cluster: the daemons and slurmstepd carry FIBER_SLURM_ENGINE=$state
# (set by start.sh), job processes carry SLURM_CONF=$conf and a SLURM_JOB_ID
cluster_pids() {
    local environ pid vars
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}; pid=${pid%/environ}
        vars=$(tr '\0' '\n' 2>/dev/null <"$environ") || continue
        if grep -qxF "FIBER_SLURM_ENGINE=$state" <<<"$vars" \
                || { grep -qxF "SLURM_CONF=$conf" <<<"$vars" \
                     && grep -q '^SLURM_JOB_ID=' <<<"$vars"; }; then
            echo "$pid"
        fi
    done
}

if alive "$(pid_of slurmctld)"; then
    SLURM_CONF=$conf scancel --batch --signal=KILL --state=RUNNING -u "$(id -un)" 2>/dev/null
    SLURM_CONF=$conf scancel -u "$(id -un)" 2>/dev/null
    for _ in $(seq 100); do
        [ -z "$(SLURM_CONF=$conf squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
    done
fi
# the daemons take ~2 s each to shut down: stop them together
stop_pid slurmd & stop_pid slurmctld & stop_pid munged & wait
# munged: stopped by the last test cluster that used it, if a test engine started it
(
    flock 9
    rm -f "/run/munge/fiber-engines/${state//\//_}"
    for entry in /run/munge/fiber-engines/*; do  # (an engine that never stopped)
        [ -e "$entry" ] && [ ! -d "$(cat "$entry")" ] && rm -f "$entry"
    done
    pid=$(cat /run/munge/fiber-engine.pid 2>/dev/null)
    if [ -n "$pid" ] && [ -z "$(ls -A /run/munge/fiber-engines 2>/dev/null)" ]; then
        if [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = munged ]; then
            kill -TERM "$pid" 2>/dev/null
            for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
            alive "$pid" && kill -KILL "$pid" 2>/dev/null
        fi
        rm -f /run/munge/fiber-engine.pid
    fi
) 9>/run/lock/fiber-slurm-engine.lock
for pid in $(cluster_pids); do
    log "killing leftover process $pid ($(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline))"
    kill -KILL "$pid" 2>/dev/null
done
rm -rf "$state"
