#!/usr/bin/env bash
# Stop the daemons scripts/slurm_up.sh started, by their PID files (never by name): slurmd,
# slurmctld, munged. Safe to run when nothing is running.
set -u
stop() {  # stop PIDFILE
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile" 2>/dev/null) || return 0
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
  kill "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  rm -f "$pidfile"
}
stop /run/slurmd.pid
stop /run/slurmctld.pid
stop /run/munge/munged.pid
echo "slurm_down: stopped"
