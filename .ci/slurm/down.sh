#!/usr/bin/env bash
# Stop the single-node Slurm that up.sh started: cancel its jobs, then stop exactly the
# daemons whose pid files up.sh wrote under $FLASHWATT_SLURM_DIR (default /tmp/flashwatt-slurm).
# A munged that was already running before up.sh has no pid file there and is left alone.
#   --purge   also delete the state folder (controller state and database together) and the
#             /etc/slurm links to it, so the next up.sh starts with job ids from 1.
set -euo pipefail

STATE=${FLASHWATT_SLURM_DIR:-/tmp/flashwatt-slurm}
PURGE=0
[[ ${1:-} == --purge ]] && PURGE=1
log() { echo "[slurm-down] $*"; }

alive_pid() { # alive_pid NAME: prints the pid from NAME.pid if that process still runs NAME (slurmd-<node>: slurmd)
  local pid
  pid=$(cat "$STATE/run/$1.pid" 2>/dev/null) || return 1
  [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "${1%%-*}"* ]] && echo "$pid"
}

stop() { # stop NAME: TERM, wait up to 15 s, then KILL
  local pid
  if pid=$(alive_pid "$1"); then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 150); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
    if [[ -d /proc/$pid ]]; then log "$1 ($pid) ignored TERM; killing"; kill -KILL "$pid" 2>/dev/null || true; fi
    log "stopped $1 ($pid)"
  fi
  rm -f "$STATE/run/$1.pid"
}

if alive_pid slurmctld >/dev/null; then
  jobs=$(timeout 5 squeue -h -o %A 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    log "cancelling jobs: $(echo $jobs)"
    timeout 10 scancel $jobs 2>/dev/null || true
    for _ in $(seq 100); do [[ -z $(timeout 5 squeue -h -o %A 2>/dev/null) ]] && break; sleep 0.2; done
  fi
fi

HOST=$(hostname -s)
for name in slurmd "slurmd-$HOST" "slurmd-$HOST-2" slurmctld slurmdbd mariadbd munged; do stop "$name"; done

if ((PURGE)); then
  for f in slurm.conf gres.conf slurmdbd.conf; do
    [[ -L /etc/slurm/$f && $(readlink "/etc/slurm/$f") == "$STATE/etc/$f" ]] && rm -f "/etc/slurm/$f"
  done
  rm -rf "$STATE"
  log "removed $STATE"
fi
