#!/usr/bin/env bash
# A real single-host SLURM cluster for the integration tests (tests/workflow/test_slurm.py), on Debian as root,
# without systemd: munged, MariaDB + slurmdbd (so `sacct` answers; the executor plugin polls job states
# with sacct and hangs without accounting), slurmctld, and one slurmd per virtual node. Two virtual
# nodes on this host make multi-node jobs real: `srun --nodes=2` starts one task on each.
# Each node advertises stand-in GPUs (tty device files, never opened) so GPU requests are scheduled and accounted like
# on a GPU cluster. Partitions: `cpu` (default) and `gpu`, both over every node.
#
# Idempotent: installs what is missing, rewrites the configs, starts only daemons that are not running,
# restarts the SLURM daemons when a config changed, and waits until every node is idle.
# Stop with scripts/slurm-down.sh (by PID file). It changes no host setting but what the daemons need:
# packages, their configs, directories, the munge key, and this host's own name in /etc/hosts where
# it does not resolve (torchrun's rendezvous publishes it; a real cluster's nodes resolve theirs).
# The node names sr1..srN need not resolve (SLURM reaches every node at 127.0.0.1; multi-node
# training meets at a node's NodeAddr, stillroom/runtime/launch.py).
#
#   STILLROOM_SLURM_NODES (2)  virtual nodes, named sr1..srN
#   STILLROOM_SLURM_GPUS  (2)  stand-in GPUs per node
#   STILLROOM_SLURM_MEM_MB (2000000)  memory each node advertises: a B200 node's, so the real
#                              profile's requests schedule unchanged (nothing enforces it here)
set -euo pipefail

NODES=${STILLROOM_SLURM_NODES:-2}
GPUS=${STILLROOM_SLURM_GPUS:-2}
CLUSTER=stillroom
DBPASS=stillroom-local
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=${STILLROOM_SLURM_MEM_MB:-2000000}
LOG=/var/log/slurm
t0=$(date +%s)
say() { echo "[slurm-up $(( $(date +%s) - t0 ))s] $*"; }

[ "$(id -u)" = 0 ] || { echo "slurm-up: must run as root" >&2; exit 1; }
command -v apt-get >/dev/null || { echo "slurm-up: needs apt-get (Debian/Ubuntu)" >&2; exit 1; }

running() {  # running PIDFILE COMM: the pid in PIDFILE is alive and is COMM (never trust a name alone)
  local pid
  [ -s "$1" ] && pid=$(cat "$1") && [ -n "$pid" ] && grep -qx "$2" "/proc/$pid/comm" 2>/dev/null
}
wait_for() {  # wait_for SECONDS WHAT CMD...
  local end=$(( $(date +%s) + $1 )) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || { echo "slurm-up: timed out waiting for $what (logs: $LOG)" >&2; exit 1; }
    sleep 0.5
  done
}
stop() {  # stop PIDFILE COMM
  running "$1" "$2" || return 0
  local pid; pid=$(cat "$1"); kill "$pid"
  for _ in $(seq 60); do [ -d "/proc/$pid" ] || break; sleep 0.5; done
  rm -f "$1"
}

# 1. Packages. policy-rc.d keeps postinst scripts from starting services (no systemd here anyway).
pkgs=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server mariadb-client)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  policy=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy=1; }
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ "$policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
fi

# 2. This host's name, directories, munge key.
getent hosts "$HOST" >/dev/null || echo "127.0.0.1 $HOST" >> /etc/hosts
names=$(seq -f "sr%g" 1 "$NODES" | tr '\n' ' ')
install -d -o slurm -g slurm -m 0755 /var/spool/slurmctld "$LOG"
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
for n in $names; do install -d -m 0755 "/var/spool/slurmd/$n"; done
[ -s /etc/munge/munge.key ] || mungekey --create --force --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key; chmod 0600 /etc/munge/munge.key

# 3. Configs. Every node advertises the host's CPUs and MEM_MB (config_overrides: slurmd trusts the
# config), so N nodes oversubscribe this host N times; fine for tests, which are small. The
# controller at 127.0.0.1 too, so this host's name need not resolve either.
write() {  # write FILE MODE OWNER CONTENT: returns 0 if the content changed
  if [ "$(cat "$1" 2>/dev/null)" != "$4" ]; then
    printf '%s\n' "$4" > "$1"; chmod "$2" "$1"; chown "$3" "$1"; return 0
  fi
  return 1
}
changed=0
write /etc/slurm/slurm.conf 0644 root:root "# written by scripts/slurm-up.sh
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=slurm
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
GresTypes=gpu
ReturnToService=2
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=60
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
NodeName=sr[1-$NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN
PartitionName=cpu Nodes=sr[1-$NODES] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=sr[1-$NODES] MaxTime=INFINITE State=UP" && changed=1
# gres/gpu wants device files; tty devices stand in for GPUs (nothing opens them, jobs run on CPU).
write /etc/slurm/gres.conf 0644 root:root "AutoDetect=off
NodeName=sr[1-$NODES] Name=gpu File=/dev/tty[0-$((GPUS - 1))]" && changed=1
write /etc/slurm/slurmdbd.conf 0600 slurm:slurm "AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
LogFile=$LOG/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DBPASS
StorageLoc=slurm_acct_db" || true

# 4. munged.
running /run/munge/munged.pid munged || { say "starting munged"; runuser -u munge -- /usr/sbin/munged --force; }
wait_for 20 munge bash -c 'munge -n | unmunge'

# 5. MariaDB and slurmdbd; the cluster registered with its root account (the profile's SLURM_ACCOUNT).
install -d -o mysql -g mysql -m 0755 /run/mysqld
[ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
if ! running /run/mysqld/mysqld.pid mariadbd; then
  say "starting mariadbd"
  setsid /usr/sbin/mariadbd --user=mysql --pid-file=/run/mysqld/mysqld.pid --socket=/run/mysqld/mysqld.sock \
    --bind-address=127.0.0.1 --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
    >> /var/log/mysql-slurm.log 2>&1 < /dev/null &
fi
wait_for 60 mariadb mariadb-admin --socket=/run/mysqld/mysqld.sock ping
mariadb --socket=/run/mysqld/mysqld.sock -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DBPASS';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
running /run/slurmdbd.pid slurmdbd || { say "starting slurmdbd"; /usr/sbin/slurmdbd; }
wait_for 60 slurmdbd sacctmgr -n list cluster
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  say "registering cluster $CLUSTER"
  sacctmgr -i add cluster "$CLUSTER" >/dev/null  # also creates the root account and its association
fi
# the account the README's SLURM commands name (SLURM_ACCOUNT=myproj), so they run here verbatim
if ! sacctmgr -n -P list assoc account=myproj user=root format=account | grep -qx myproj; then
  say "adding account myproj for root"
  sacctmgr -i add account myproj cluster="$CLUSTER" >/dev/null
  sacctmgr -i add user root account=myproj cluster="$CLUSTER" >/dev/null
fi

# 6. slurmctld and one slurmd per node (restarted if a config changed).
if [ "$changed" = 1 ]; then
  for n in $names; do stop "/run/slurmd-$n.pid" slurmd; done
  stop /run/slurmctld.pid slurmctld
fi
running /run/slurmctld.pid slurmctld || { say "starting slurmctld"; /usr/sbin/slurmctld; }
wait_for 60 slurmctld scontrol ping
for n in $names; do
  running "/run/slurmd-$n.pid" slurmd || { say "starting slurmd $n"; /usr/sbin/slurmd -N "$n"; }
done

end=$(( $(date +%s) + 90 ))
while :; do
  states=$(sinfo -h -N -p cpu -o '%N %T' 2>/dev/null | sort -u)
  busy=$(echo "$states" | awk '$2 !~ /^(idle|mixed|allocated)$/' | wc -l)
  [ -n "$states" ] && [ "$busy" = 0 ] && break
  for n in $(echo "$states" | awk '$2 ~ /^(down|drain|fail)/ {print $1}'); do
    scontrol update nodename="$n" state=resume 2>/dev/null || true
  done
  [ "$(date +%s)" -lt "$end" ] || { echo "slurm-up: nodes not idle: $states (logs: $LOG)" >&2; exit 1; }
  sleep 0.5
done
say "ready: $(echo "$states" | tr '\n' ' ')"
