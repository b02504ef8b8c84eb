#!/usr/bin/env bash
# Start a real single-node Slurm cluster on this machine (root, no systemd, no cgroups): munge,
# slurmctld and slurmd, with NGPU fake GPUs so that GPU requests are scheduled as on a cluster.
# For developers and CI; stop it with scripts/slurm_down.sh (by PID, never by name).
# Usage: [NGPU=2] bash scripts/slurm_up.sh      Idempotent: a running cluster is left as it is.
set -euo pipefail
NGPU=${NGPU:-2}
[[ $(id -u) == 0 ]] || { echo "slurm_up: needs root" >&2; exit 3; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || { echo "slurm_up: Slurm is not installed and there is no apt-get" >&2; exit 3; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq $((limit * 10))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "slurm_up: $what did not come up within $limit s" >&2; return 1
}

# munge: the package made the key; the daemon runs as the munge user.
install -d -o munge -g munge -m 0755 /run/munge
if ! [[ -S /run/munge/munge.socket.2 ]] || ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  wait_for 10 munged test -S /run/munge/munge.socket.2
fi

host=$(hostname -s)
# The node layout slurmd detects, with RealMemory a little below the machine's.
detected=$(slurmd -C | head -1)
layout=$(grep -oE '(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=[0-9]+' <<< "$detected" | tr '\n' ' ')
mem=$(grep -oE 'RealMemory=[0-9]+' <<< "$detected" | cut -d= -f2)
mem=$((mem * 9 / 10))
for i in $(seq 0 $((NGPU - 1))); do [[ -e /dev/fakegpu$i ]] || mknod -m 666 /dev/fakegpu$i c 1 3; done
# The credential window is also how long Slurm holds a requeued job before it may start again
# (slurmctld's job_mgr.c: begin_time = now + cred_expire + 1; 120 s by default, 5 s at least). A
# real cluster keeps its default; on one localhost node a launch credential crosses in milliseconds,
# so 10 s: the requeue test's job starts again ~11 s after `scontrol requeue` instead of ~121 s.
conf=$(cat <<CONF
# written by dlcrepro scripts/slurm_up.sh: a single-node test cluster
ClusterName=dlcrepro
SlurmctldHost=${host}(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
MinJobAge=300
ReturnToService=2
SchedulerType=sched/backfill
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=${host} NodeAddr=127.0.0.1 ${layout} RealMemory=${mem} Gres=gpu:${NGPU} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
)
# up: the controller answers and the node takes jobs (idle, or busy with someone's: mixed, allocated,
# completing). Only idle once counted, so a second test run found a busy cluster "not running" and
# restarted it (`slurmctld -c`), killing the first run's jobs.
running() { scontrol ping 2>/dev/null | grep -q "is UP" && [[ $(sinfo -h -o %T 2>/dev/null | head -1) =~ ^(idle|mix|alloc|comp) ]]; }
if running; then
  # a cluster this script started with another slurm.conf (an older checkout's) is restarted with
  # this one; anyone else's is left alone
  if [[ ! -f /etc/slurm/slurm.conf ]] || ! head -1 /etc/slurm/slurm.conf | grep -q "dlcrepro scripts/slurm_up.sh" \
     || [[ $(cat /etc/slurm/slurm.conf) == "$conf" ]]; then
    echo "slurm_up: already running"; exit 0
  fi
  echo "slurm_up: restarting the running test cluster with this checkout's slurm.conf"
  bash "$(dirname "$0")/slurm_down.sh" >/dev/null
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
printf '%s\n' "$conf" > /etc/slurm/slurm.conf
if (( NGPU > 0 )); then
  echo "NodeName=${host} Name=gpu File=/dev/fakegpu[0-$((NGPU - 1))]" > /etc/slurm/gres.conf
else
  : > /etc/slurm/gres.conf
fi

slurmctld -c
wait_for 30 slurmctld bash -c 'scontrol ping | grep -q "is UP"'
slurmd
wait_for 30 "slurmd (node idle)" bash -c '[[ $(sinfo -h -o %T | head -1) == idle* ]]'
echo "slurm_up: node ${host} idle: ${layout} RealMemory=${mem} gpu:${NGPU}"
