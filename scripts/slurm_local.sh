#!/usr/bin/env bash
# A one-node Slurm cluster of this machine, for the tests of the Slurm launcher against the
# real sbatch (tests/experiments/test_slurm.py) and for trying `reproduce --launcher slurm`
# by hand (docs/how-to/cluster.md).
#
#   bash scripts/slurm_local.sh start    # install slurm-wlm and munge where missing, start them
#   bash scripts/slurm_local.sh status   # sinfo
#   bash scripts/slurm_local.sh stop     # cancel every job, stop slurmd, slurmctld and munged
#
# As root (CI runs as root). Debian's packages (apt-get install slurm-wlm munge); munged,
# slurmctld and slurmd for localhost: one node of this machine's CPUs and memory, one
# partition `debug` (the default), no GPUs, no accounting database (sacct reads nothing:
# a real cluster has slurmdbd), the state under $SLURM_LOCAL_STATE (default /tmp/slurm-local).
# A second `start` finds it running and does nothing.
set -euo pipefail

STATE="${SLURM_LOCAL_STATE:-/tmp/slurm-local}"
CONF=/etc/slurm/slurm.conf

say() { echo "slurm_local: $*"; }

install() {
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    say "installing slurm-wlm and munge (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

configure() {
    local cpus mem_mb
    cpus="$(nproc)"
    mem_mb="$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)"
    mkdir -p "$STATE"/{ctld,d,log} /etc/slurm /run/munge /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        mungekey --create --force >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
        chown munge:munge /etc/munge/munge.key
        chmod 400 /etc/munge/munge.key
    fi
    cat > "$CONF" <<EOF
# written by scripts/slurm_local.sh: a one-node cluster of this machine
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job waits cred_expire + 1 s before it starts again (default 120 s)
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# no cgroups in a container: processes tracked by their parents, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# what a preempted or failed node does to its jobs: requeued (submitit asks for it too)
JobRequeue=1
ReturnToService=2
# no accounting database: sacct has nothing to read here (a real cluster has slurmdbd)
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# quick reactions, for tests: the time limit checked every few seconds, a killed job gone soon
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=20
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
NodeName=localhost CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    # Debian's packages read the configuration from /etc/slurm; cgroup.conf is read even unused
    printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n' > /etc/slurm/cgroup.conf
}

running() { pgrep -x "$1" >/dev/null 2>&1; }

start() {
    local started
    started=$(date +%s.%N)
    install
    if running slurmctld && running slurmd && sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then
        say "already running"; sinfo; return
    fi
    configure
    running munged || munged --force --pid-file="$STATE/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munged.seed"
    running slurmctld || slurmctld -c -f "$CONF"   # -c: a clean state (no jobs of an earlier start)
    running slurmd || slurmd -f "$CONF"
    for _ in $(seq 1 120); do  # up to a minute for the node to register
        if sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then
            break
        fi
        sleep 0.5
    done
    if ! sinfo -h -o %T 2>/dev/null | grep -qE 'idle|mixed|alloc'; then
        say "the node did not come up; see $STATE/log/"
        tail -n 20 "$STATE"/log/*.log >&2 || true
        exit 1
    fi
    scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
    sinfo
    say "started in $(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
}

stop() {
    if running slurmctld; then
        scancel --user="$(id -un)" >/dev/null 2>&1 || true
    fi
    # each daemon by the pid it wrote when this script started it
    local pidfile pid
    for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/munged.pid"; do
        pid="$(cat "$pidfile" 2>/dev/null || true)"
        if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
            for _ in $(seq 1 40); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.25
            done
        fi
        rm -f "$pidfile"
    done
    say "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
