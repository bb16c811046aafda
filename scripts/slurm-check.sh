#!/usr/bin/env bash
# Runs examples/slurm/ under a real single-node Slurm on this machine and checks that the merged
# report equals the report of one unsharded run (timing and predictions aside), as
# tests/it/cluster.rs checks it with the environment Slurm would set.
#
#   sudo apt-get install -y slurm-wlm munge     # once (Debian's packages)
#   scripts/slurm-check.sh                       # as root: starts munged, slurmctld and slurmd
#
# The cluster is one node (this host, every core), its configuration and state in a temporary
# folder (SLURM_CONF); the daemons are stopped at the end. Audit: KVAUDIT_ARGS (default the
# native target with the refcount fault, depth 3: findings to merge), SHARDS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in munged slurmctld slurmd sbatch squeue; do
  command -v "$tool" >/dev/null || { echo "slurm-check: $tool not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "slurm-check: run as root (it starts the Slurm daemons)" >&2; exit 2; }

cargo build --release
work=$(mktemp -d)
host=$(hostname -s)
cores=$(nproc)
mkdir -p "$work"/{spool,state,log,bin,shards} /run/munge
cp target/release/kvaudit target/release/kvaudit-llama-worker "$work/bin/"
cat >"$work/slurm.conf" <<EOF
ClusterName=kvaudit
SlurmctldHost=$host
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmdSpoolDir=$work/spool
StateSaveLocation=$work/state
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmUser=root
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$host CPUs=$cores State=UNKNOWN
PartitionName=check Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$work/slurm.conf
stop() {
  [ -f "$work/slurmd.pid" ] && kill "$(cat "$work/slurmd.pid")" 2>/dev/null || true
  [ -f "$work/slurmctld.pid" ] && kill "$(cat "$work/slurmctld.pid")" 2>/dev/null || true
  rm -rf "$work"
}
trap stop EXIT
pgrep -x munged >/dev/null || munged --force
slurmctld
slurmd
for _ in $(seq 30); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 1; done

args=${KVAUDIT_ARGS:---target native --inject refcount --depth 3}
cd "$work"
merge=$(KVAUDIT="$work/bin/kvaudit" KVAUDIT_ARGS="$args" KVAUDIT_OUT="$work/shards" \
  SHARDS=${SHARDS:-3} "$OLDPWD/examples/slurm/submit.sh")
echo "slurm-check: submitted; merge job $merge" >&2
while squeue -h | grep -q .; do sleep 1; done
read -r -a argv <<<"$args"
"$work/bin/kvaudit" audit "${argv[@]}" --format json --out "$work/whole.json" >/dev/null 2>&1 || true
python3 - "$work/shards/report.json" "$work/whole.json" <<'PY'
import json, sys
def norm(path):
    r = json.load(open(path))
    for k in ("timing", "prediction", "kvaudit"):
        r.pop(k, None)
    return r
merged, whole = norm(sys.argv[1]), norm(sys.argv[2])
if merged != whole:
    sys.exit("slurm-check: the merged report differs from the unsharded one in: "
             + ", ".join(k for k in whole if merged.get(k) != whole.get(k)))
print(f"slurm-check: the merged report of the Slurm array equals the unsharded one "
      f"({whole['trials']} trials, {len(whole['findings'])} findings)")
PY
