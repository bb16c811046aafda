#!/usr/bin/env bash
# Regenerates reports/matrix/mlx-lm.{md,json}: the version matrix of the corpus files recorded on
# mlx-lm (those whose targets name an mlx-lm version) over every mlx-lm version kvaudit knows
# (`mlx-lm@all`: src/targets/mlx.rs, PINS), oldest first. An environment not made yet is made
# first from the package registry (under a minute each); each cell starts one worker.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
mkdir -p reports/matrix
files=$(grep -l '"target": *"mlx-lm@' corpora/*.json)
# Exit 3 means some cell could not be judged (an environment that cannot be made): the table
# says which.
nice -n 19 $k matrix $files --targets mlx-lm@all \
  --markdown reports/matrix/mlx-lm.md --json reports/matrix/mlx-lm.json || [ $? -eq 3 ]
