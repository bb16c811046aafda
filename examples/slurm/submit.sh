#!/bin/bash
# Submits a sharded kvaudit audit to Slurm: SHARDS array tasks, then the merge once they all
# succeeded. Prints the merge job's id.
#
#   KVAUDIT_ARGS="--target llama.cpp@0.1.161 --depth 4" SHARDS=8 examples/slurm/submit.sh
#
# Run it again after a task failed or was stopped: tasks whose report is finished give it back
# at once, stopped ones resume from their partial report.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shards=${SHARDS:-4}
export KVAUDIT=${KVAUDIT:-$(command -v kvaudit)}
export KVAUDIT_OUT=${KVAUDIT_OUT:-$PWD/kvaudit-shards}
export KVAUDIT_ARGS=${KVAUDIT_ARGS:---depth 4}
array=$(sbatch --parsable --array=0-$((shards - 1)) "$here/audit-array.sbatch")
sbatch --parsable --dependency=afterok:"${array%%;*}" "$here/merge.sbatch"
