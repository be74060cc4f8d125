#!/usr/bin/env bash
# Stops what scripts/slurm-up.sh started, each daemon by its own PID file (never by name, so nothing
# else on the machine is touched): slurmd per node, slurmctld, slurmdbd, mariadbd, munged.
set -uo pipefail
stop() {  # stop PIDFILE COMM
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  if [ -n "$pid" ] && grep -qx "$2" "/proc/$pid/comm" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
    [ -d "/proc/$pid" ] && { echo "$2 ($pid) ignored SIGTERM for 30 s: SIGKILL"; kill -9 "$pid"; }
    echo "stopped $2 ($pid)"
  fi
  rm -f "$1"
}
for f in /run/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done
stop /run/slurmctld.pid slurmctld
stop /run/slurmdbd.pid slurmdbd
stop /run/mysqld/mysqld.pid mariadbd
stop /run/munge/munged.pid munged
