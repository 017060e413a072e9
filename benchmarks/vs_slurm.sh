#!/usr/bin/env bash
# Same N one-GPU `true` jobs through Slurm and through hai (local backend, 8 virtual GPUs) on this
# machine: wall time until all finished, submissions/s, submit->start latency, and hai/slurm ratios.
# Usage: benchmarks/vs_slurm.sh [JOBS] [THREADS]   (run as root; everything stops on exit)
set -euo pipefail

JOBS=${1:-1000}
THREADS=${2:-16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
HELPER="$ROOT/benchmarks/vs_slurm_jobs.py"
WORK=$(mktemp -d /tmp/hai-vs-slurm.XXXXXX)
HOST=$(hostname -s)
pids=()

stop_all() {
    # Only what this script started, newest first, by pid.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill "${pids[i]}" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap stop_all EXIT INT TERM

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2
    shift 2
    for ((t = 0; t < limit * 10; t++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "Error: $what did not come up within ${limit}s. See the logs under $WORK." >&2
    return 1
}

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "installing slurm-wlm and munge (Debian packages)..." >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# ---- munge, with its own key and socket ---------------------------------------------------------
mkdir -p "$WORK/munge"
dd if=/dev/urandom of="$WORK/munge/munge.key" bs=1024 count=1 status=none
chmod 700 "$WORK/munge"
chmod 400 "$WORK/munge/munge.key"
MUNGE_SOCKET="$WORK/munge/munge.socket"
munged --foreground --force --key-file="$WORK/munge/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/munge/munged.log" \
    --seed-file="$WORK/munge/munged.seed" >"$WORK/munge/munged.out" 2>&1 &
pids+=($!)
wait_for 10 munged test -S "$MUNGE_SOCKET"

# ---- one Slurm node with 8 GPUs (character devices, since 22.05 needs File= for gres) ---------
mkdir -p "$WORK/dev" "$WORK/state" "$WORK/spool"
for g in 0 1 2 3 4 5 6 7; do mknod "$WORK/dev/gpu$g" c 1 3; done
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
CPUS=$(nproc)
MEM_MB=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2))
export SLURM_CONF="$WORK/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=haibench
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
MinJobAge=600
MaxJobCount=100000
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:8 State=UNKNOWN
PartitionName=bench Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
echo "NodeName=$HOST Name=gpu File=$WORK/dev/gpu[0-7]" >"$WORK/gres.conf"

slurmctld -D -i -f "$SLURM_CONF" >"$WORK/slurmctld.out" 2>&1 &
pids+=($!)
wait_for 30 slurmctld scontrol ping
slurmd -D -f "$SLURM_CONF" >"$WORK/slurmd.out" 2>&1 &
pids+=($!)
wait_for 30 "slurmd (node idle)" bash -c "sinfo -h -N -o %T | grep -q idle"

# Figures depend on what else runs: the load average goes with them.
load() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD_SLURM=$(load)
echo "slurm: submitting $JOBS jobs from $THREADS threads..." >&2
"$PY" "$HELPER" slurm --jobs "$JOBS" --threads "$THREADS" --jobcomp "$WORK/jobcomp.txt" \
    --out "$WORK/slurm.json" >/dev/null

# Slurm goes quiet before hai runs, so the two never share the CPUs.
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null || true; wait "${pids[i]}" 2>/dev/null || true; done
pids=()

# ---- hai: the real server, local backend, one node of 8 virtual GPUs ----------------------------
export HAI_HOME="$WORK/hai"
mkdir -p "$HAI_HOME" "$WORK/code"
HAI_PORT=$(free_port)
cat >"$HAI_HOME/config.toml" <<EOF
[server]
backend = "local"
policy = "seed"
host = "127.0.0.1"
port = $HAI_PORT

[backend]

[[nodes]]
name = "local"
gpu_type = "V100"
gpus = 8
cpus = 64
memory_gb = 512
virtual = true

[[resource_packages]]
id = 454
name = "1xV100"
gpu_type = "V100"
gpus = 1
cpus = 4
memory_gb = 32

[[groups]]
name = "bench"
admins = ["bench"]

[[users]]
name = "bench"
group = "bench"
role = "platform_admin"
token = "vs-slurm-bench"
EOF
export HAI_TOKEN="vs-slurm-bench"
(cd "$ROOT" && exec "$PY" -m hai_airflow.server --config "$HAI_HOME/config.toml") >"$WORK/hai-server.log" 2>&1 &
pids+=($!)
wait_for 60 "hai server" curl -fsS "http://127.0.0.1:$HAI_PORT/health"

LOAD_HAI=$(load)
echo "hai: submitting $JOBS jobs from $THREADS threads..." >&2
"$PY" "$HELPER" hai --jobs "$JOBS" --threads "$THREADS" --server "http://127.0.0.1:$HAI_PORT" \
    --code-dir "$WORK/code" --out "$WORK/hai.json" >/dev/null

"$PY" "$HELPER" report "$WORK/slurm.json" "$WORK/hai.json"
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null) ]]; then COMMIT="$COMMIT+changes"; fi
echo "hai at $COMMIT on $(nproc) CPUs; load average (1, 5, 15 min) when slurm started: $LOAD_SLURM," \
    "when hai started: $LOAD_HAI, at the end: $(load)"
"$PY" "$ROOT/benchmarks/machine.py"
