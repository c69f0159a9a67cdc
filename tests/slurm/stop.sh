#!/usr/bin/env bash
# Tear down the test cluster that tests/slurm/start.sh brought up in DIR: cancel its jobs, then
# end its daemons by the process ids recorded in DIR/*.pid (never by name).
set -uo pipefail

DIR=${1:?usage: stop.sh DIR}
[ -d "$DIR" ] || exit 0
export SLURM_CONF="$DIR/slurm.conf"

if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
  # jobs first, so no slurmstepd outlives slurmd
  scancel --full --quiet --partition=debug 2>/dev/null || true
  for _ in $(seq 50); do
    [ -z "$(squeue -h -t PENDING,RUNNING,COMPLETING,CONFIGURING -o %i 2>/dev/null)" ] && break
    sleep 0.2
  done
fi

stop_pid() {  # stop_pid NAME: TERM, wait up to 5 s, then KILL
  local file="$DIR/$1.pid" pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$file"
}

stop_pid slurmd
stop_pid slurmctld
stop_pid munged
exit 0
