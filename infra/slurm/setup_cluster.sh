#!/usr/bin/env bash
# Start a Slurm cluster on this machine (Debian/Ubuntu, as root), with Slurm's own accounting: munge, MariaDB,
# slurmdbd, slurmctld, and one slurmd per node. Used by `make services` (the Slurm integration tests) and by anyone
# who wants to try `launcher: slurm` on one machine.
#
#   infra/slurm/setup_cluster.sh               # one node on 127.0.0.1 (the default)
#   infra/slurm/setup_cluster.sh --nodes 2     # two nodes, each a network namespace (see below)
#   infra/slurm/setup_cluster.sh --nodes 2 restart   # rewrite the config and restart every daemon
#   infra/slurm/setup_cluster.sh stop          # stop the daemons; remove every namespace, link and hosts line
#   infra/slurm/setup_cluster.sh --accounting none   # no slurmdbd: a `sacct` answering from `scontrol` (fallback)
#
# Several nodes: node i is the network namespace ff-node<i> with its own host name (a UTS namespace), its own
# /dev/shm (a node's RAM is its own), its own slurmd, spool and log, and the address 10.77.77.1<i> on a veth pair
# whose other end is on the bridge ffbr0 (10.77.77.1, host name ff-ctl, where slurmctld listens). Every namespace
# sees the same filesystem, as a shared filesystem would. The addresses exist only on that bridge, are named in
# /etc/hosts (lines marked `# forgeflow-cluster`) and nothing else is contacted. A running node's slurmd that died
# (a pulled plug) is started again by a plain rerun. Slurm timeouts are short for tests: a node that stops answering
# is DOWN after SlurmdTimeout=10 s, and a node whose slurmd registers again returns to service (ReturnToService=2).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONF_DIR=/etc/slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOG=/var/log/slurm
BRIDGE=ffbr0
NET=10.77.77
MARK="# forgeflow-cluster"
NODES=1
ACCOUNTING=slurmdbd
ACTION=start

while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) NODES="$2"; shift 2 ;;
        --accounting) ACCOUNTING="$2"; shift 2 ;;
        start|restart|stop) ACTION="$1"; shift ;;
        *) echo "setup_cluster.sh: unknown argument $1 (use --nodes N, --accounting slurmdbd|none, start|restart|stop)" >&2
           exit 2 ;;
    esac
done
if ! [[ "$NODES" =~ ^[1-9]$ ]]; then echo "setup_cluster.sh: --nodes $NODES: use 1 to 9" >&2; exit 2; fi
if [[ "$ACCOUNTING" != slurmdbd && "$ACCOUNTING" != none ]]; then
    echo "setup_cluster.sh: --accounting $ACCOUNTING: use slurmdbd or none" >&2; exit 2
fi

node_names() { for i in $(seq 1 "$NODES"); do echo "ff-node$i"; done; }
node_slurmd_running() { ip netns pids "$1" 2>/dev/null | xargs -r ps -o comm= -p 2>/dev/null | grep -qx slurmd; }
wanted_conf() { grep -qs "written by forgeflow.*nodes=$NODES accounting=$ACCOUNTING" "$CONF_DIR/slurm.conf"; }

kill_node() {  # every process of a node's namespace, then the namespace (its veth goes with it)
    ip netns pids "$1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$1" 2>/dev/null || true
}

stop_all() {
    for ns in $(ip netns list 2>/dev/null | awk '/^ff-node[0-9]/ {print $1}'); do kill_node "$ns"; done
    ip link del "$BRIDGE" 2>/dev/null || true
    if grep -q "$MARK" /etc/hosts; then  # rewrite in place: /etc/hosts may be a bind mount (no rename)
        grep -v "$MARK" /etc/hosts > /tmp/forgeflow-hosts.$$ || true
        cat /tmp/forgeflow-hosts.$$ > /etc/hosts; rm -f /tmp/forgeflow-hosts.$$
    fi
    stop_daemons slurmd slurmctld slurmdbd
}

stop_daemons() {  # SIGTERM, then SIGKILL whatever has not exited after 10 s (a new daemon needs the old one's port)
    for d in "$@"; do pkill -x "$d" || true; done
    for _ in $(seq 1 50); do
        local left=0
        for d in "$@"; do pgrep -x "$d" >/dev/null && left=1; done
        [[ "$left" == 0 ]] && return 0
        sleep 0.2
    done
    for d in "$@"; do pkill -9 -x "$d" || true; done
    sleep 0.5
}

cluster_ready() {  # every node idle/mix/alloc and the right config
    wanted_conf && pgrep -x slurmctld >/dev/null || return 1
    if [[ "$ACCOUNTING" == slurmdbd ]]; then pgrep -x slurmdbd >/dev/null || return 1; fi
    local states; states="$(sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ')"
    [[ -n "$states" && "$states" =~ ^((idle|mix|alloc)\ )+$ ]]
}

if [[ "$ACTION" == stop ]]; then
    stop_all
    if command -v mysqladmin >/dev/null && mysqladmin ping --silent >/dev/null 2>&1; then mysqladmin shutdown || true; fi
    echo "slurm stopped; namespaces, bridge and hosts lines removed"
    exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "setup_cluster.sh: run as root (it installs packages, starts daemons and creates network namespaces)" >&2
    exit 1
fi
if [[ "$ACTION" == start ]] && cluster_ready; then
    echo "slurm already running: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')"; exit 0
fi

install_packages() {
    local want=(slurm-wlm munge)
    [[ "$ACCOUNTING" == slurmdbd ]] && want+=(slurmdbd mariadb-server)
    local missing=()
    for p in "${want[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    command -v ip >/dev/null || missing+=(iproute2)
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "installing ${missing[*]} (apt-get)…"
        (apt-get update -qq || true)
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

start_munge() {  # one key, one daemon; its socket is a file every namespace sees
    mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
    [[ -s /etc/munge/munge.key ]] || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
    chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
    if ! pgrep -x munged >/dev/null; then
        if id munge >/dev/null 2>&1; then runuser -u munge -- munged --force; else munged --force; fi
    fi
}

start_mariadb() {  # local socket only (no TCP port); the accounting database and its user
    if ! mysqladmin ping --silent >/dev/null 2>&1; then
        mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
        [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >/dev/null
        setsid nohup mysqld_safe --skip-networking </dev/null >/dev/null 2>&1 &
        for _ in $(seq 1 60); do mysqladmin ping --silent >/dev/null 2>&1 && break; sleep 0.5; done
        mysqladmin ping --silent >/dev/null || { echo "setup_cluster.sh: MariaDB did not start (see /var/log/mysql)" >&2; exit 1; }
    fi
    local pass_file="$CONF_DIR/forgeflow-dbd.pass"
    [[ -s "$pass_file" ]] || (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$pass_file")
    DBD_PASS="$(cat "$pass_file")"
    mysql -u root <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${DBD_PASS}';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '${DBD_PASS}';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
}

start_slurmdbd() {
    (umask 077; cat > "$CONF_DIR/slurmdbd.conf" <<CONF
# written by forgeflow infra/slurm/setup_cluster.sh
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=${LOG}/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=${DBD_PASS}
StorageLoc=slurm_acct_db
CONF
)
    stop_daemons slurmdbd
    slurmdbd
    for _ in $(seq 1 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
    sacctmgr -n list cluster >/dev/null || { echo "setup_cluster.sh: slurmdbd did not answer; see ${LOG}/slurmdbd.log" >&2; exit 1; }
    sacctmgr -n -P list cluster format=cluster | grep -qx forgeflow || sacctmgr -i add cluster forgeflow >/dev/null
}

next_job_id() {  # job ids continue after those already in the accounting database (no duplicate ids in sacct)
    local last=0
    if [[ "$ACCOUNTING" == slurmdbd ]]; then
        last="$(sacct -n -X -a -P -S 2000-01-01 -o JobIDRaw 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1 || true)"
    fi
    echo $(( ${last:-0} + 1 ))
}

make_network() {  # bridge + one namespace per node, named in /etc/hosts
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$NET.1/24" dev "$BRIDGE"; ip link set "$BRIDGE" up
    local lines="$NET.1 ff-ctl $MARK"$'\n'
    for i in $(seq 1 "$NODES"); do
        local ns="ff-node$i"
        if ! ip netns list | grep -qw "$ns"; then
            ip netns add "$ns"
            ip link add "ffv$i" type veth peer name eth0 netns "$ns"
            ip link set "ffv$i" master "$BRIDGE" up
            ip -n "$ns" addr add "$NET.1$i/24" dev eth0
            ip -n "$ns" link set eth0 up; ip -n "$ns" link set lo up
        fi
        ip link set "ffv$i" up
        lines+="$NET.1$i $ns $MARK"$'\n'
    done
    grep -v "$MARK" /etc/hosts > /tmp/forgeflow-hosts.$$ || true
    printf '%s' "$lines" >> /tmp/forgeflow-hosts.$$
    cat /tmp/forgeflow-hosts.$$ > /etc/hosts; rm -f /tmp/forgeflow-hosts.$$
}

write_slurm_conf() {
    local cpus mem ctl nodes_conf="" spool="$SPOOL" pidfile=/run/slurmd.pid logfile="$LOG/slurmd.log"
    cpus="$(nproc)"
    mem="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))"
    if [[ "$NODES" == 1 ]]; then
        ctl="$(hostname -s)(127.0.0.1)"
        nodes_conf="NodeName=$(hostname -s) NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN"
    else
        ctl="$(hostname -s)($NET.1)"; spool="$SPOOL/%n"; pidfile="/run/slurmd-%n.pid"; logfile="$LOG/slurmd-%n.log"
        for i in $(seq 1 "$NODES"); do
            nodes_conf+="NodeName=ff-node$i NodeAddr=$NET.1$i CPUs=${cpus} RealMemory=$(( mem / NODES )) State=UNKNOWN"$'\n'
        done
    fi
    local storage="AccountingStorageType=accounting_storage/none"
    [[ "$ACCOUNTING" == slurmdbd ]] && storage="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819"
    cat > "$CONF_DIR/slurm.conf" <<CONF
# written by forgeflow infra/slurm/setup_cluster.sh nodes=${NODES} accounting=${ACCOUNTING} (root)
ClusterName=forgeflow
SlurmctldHost=${ctl}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=${STATE}
SlurmdSpoolDir=${spool}
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=${pidfile}
SlurmctldLogFile=${LOG}/slurmctld.log
SlurmdLogFile=${logfile}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=10
MessageTimeout=5
KillWait=5
MinJobAge=3600
FirstJobId=$(next_job_id)
SchedulerType=sched/backfill
${storage}
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
${nodes_conf}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
    rm -f "$CONF_DIR/cgroup.conf"
}

start_node() {  # slurmd inside the node's namespace, with the node's host name and its own /dev/shm
    local ns="$1"
    node_slurmd_running "$ns" && return 0
    mkdir -p "$SPOOL/$ns"
    # nsenter, not `ip netns exec`: that mounts a fresh /sys, without the cgroup tree slurmd reads
    nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation slave \
        sh -c "mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm && hostname $ns && exec slurmd"
}

wait_nodes_idle() {
    local names=("$@") deadline=$((SECONDS + 90))
    while [[ $SECONDS -lt $deadline ]]; do
        pgrep -x slurmctld >/dev/null || { echo "setup_cluster.sh: slurmctld exited; see ${LOG}/slurmctld.log" >&2; return 1; }
        local ready=0
        for n in "${names[@]}"; do
            local state; state="$(sinfo -h -n "$n" -o %t 2>/dev/null || true)"
            case "$state" in
                idle|mix|alloc) ready=$((ready + 1)) ;;
                down*|drain*) scontrol update nodename="$n" state=resume 2>/dev/null || true ;;
            esac
        done
        if [[ "$ready" == "${#names[@]}" ]]; then
            echo "slurm ready: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')(accounting: $ACCOUNTING)"; return 0
        fi
        sleep 1
    done
    echo "setup_cluster.sh: nodes ${names[*]} did not become idle; see ${LOG}/slurmctld.log and ${LOG}/slurmd*.log" >&2
    sinfo -N >&2 || true
    return 1
}

install_packages
if [[ -f "$CONF_DIR/slurm.conf" ]] && ! grep -q "written by forgeflow" "$CONF_DIR/slurm.conf" \
        && [[ "${FORGEFLOW_SLURM_OVERWRITE:-0}" != 1 ]]; then
    echo "setup_cluster.sh: $CONF_DIR/slurm.conf belongs to another cluster; not touching it" \
         "(set FORGEFLOW_SLURM_OVERWRITE=1 to replace it on a scratch machine)" >&2
    exit 1
fi
mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOG"
start_munge

if [[ "$ACTION" == start && "$NODES" -gt 1 ]] && wanted_conf && pgrep -x slurmctld >/dev/null; then
    # the cluster is up but a node lost its slurmd (a pulled plug): start it again, touch nothing else
    make_network
    for ns in $(node_names); do start_node "$ns"; done
    wait_nodes_idle $(node_names); exit $?
fi

stop_all
write_slurm_conf  # sacctmgr and sacct read it to find slurmdbd
if [[ "$ACCOUNTING" == slurmdbd ]]; then
    start_mariadb; start_slurmdbd
    rm -f /usr/local/bin/sacct  # Slurm's own sacct (/usr/bin/sacct), not the fallback
    write_slurm_conf  # again, now that the accounting database can say which job id comes next
else
    install -m 0755 "$HERE/sacct_shim.py" /usr/local/bin/sacct  # a real sacct without slurmdbd only prints errors
fi
slurmctld -c   # -c: clean start, no stale jobs from an earlier cluster (FirstJobId continues the numbering)
if [[ "$NODES" == 1 ]]; then
    slurmd
    wait_nodes_idle "$(hostname -s)"
else
    make_network
    for ns in $(node_names); do start_node "$ns"; done
    wait_nodes_idle $(node_names)
fi
