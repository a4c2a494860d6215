#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine (Debian/Ubuntu, as root): munge + slurmctld + slurmd on
# 127.0.0.1, no accounting storage, and a small `sacct` answering from `scontrol` (submitit needs one).
# Used by `make test` (SLURM integration tests) and by anyone who wants to try `launcher: slurm` on one machine.
#   infra/slurm/setup_cluster.sh          # install if needed, (re)start, wait until the node is idle
#   infra/slurm/setup_cluster.sh restart  # rewrite the config and restart the daemons
#   infra/slurm/setup_cluster.sh stop
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOG=/var/log/slurm

if [[ "${1:-}" == "stop" ]]; then
    pkill -x slurmd || true; pkill -x slurmctld || true
    exit 0
fi
if [[ "${1:-}" != "restart" ]] && pgrep -x slurmctld >/dev/null && pgrep -x slurmd >/dev/null \
        && grep -qs "written by forgeflow" /etc/slurm/slurm.conf \
        && [[ "$(sinfo -h -o %t 2>/dev/null | head -1)" =~ ^(idle|mix|alloc)$ ]]; then
    echo "slurm already running: $(sinfo -h -o '%n %t' | head -1)"; exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "setup_cluster.sh: run as root (it installs packages and starts daemons)" >&2; exit 1
fi
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurm-wlm and munge (apt-get)…"
    (apt-get update -qq || true)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# munge: one key, one daemon
mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
if ! pgrep -x munged >/dev/null; then
    if id munge >/dev/null 2>&1; then runuser -u munge -- munged --force; else munged --force; fi
fi

if [[ -f "$CONF_DIR/slurm.conf" ]] && ! grep -q "written by forgeflow" "$CONF_DIR/slurm.conf" \
        && [[ "${FORGEFLOW_SLURM_OVERWRITE:-0}" != 1 ]]; then
    echo "setup_cluster.sh: $CONF_DIR/slurm.conf belongs to another cluster; not touching it" \
         "(set FORGEFLOW_SLURM_OVERWRITE=1 to replace it on a scratch machine)" >&2
    exit 1
fi
HOST="$(hostname -s)"
CPUS="$(nproc)"
MEM_MB="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))"
mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOG"
cat > "$CONF_DIR/slurm.conf" <<CONF
# written by forgeflow infra/slurm/setup_cluster.sh — single node, root, no accounting
ClusterName=forgeflow
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}
SlurmdSpoolDir=${SPOOL}
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=${LOG}/slurmctld.log
SlurmdLogFile=${LOG}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=3600
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
rm -f "$CONF_DIR/cgroup.conf"

# sacct shim (a real sacct without slurmdbd only prints errors)
install -m 0755 "$HERE/sacct_shim.py" /usr/local/bin/sacct

pkill -x slurmd || true; pkill -x slurmctld || true
sleep 1
slurmctld -c   # -c: clean start, no stale jobs from an earlier cluster
slurmd
for _ in $(seq 1 60); do
    state="$(sinfo -h -n "$HOST" -o %t 2>/dev/null || true)"
    if [[ "$state" == "idle" || "$state" == "mix" || "$state" == "alloc" ]]; then
        echo "slurm ready: node ${HOST} (${CPUS} cpus) state ${state}"; exit 0
    fi
    if [[ "$state" == down* || "$state" == drain* ]]; then scontrol update nodename="$HOST" state=resume || true; fi
    sleep 1
done
echo "setup_cluster.sh: node ${HOST} did not become idle; see ${LOG}/slurmctld.log and ${LOG}/slurmd.log" >&2
sinfo >&2 || true
exit 1
