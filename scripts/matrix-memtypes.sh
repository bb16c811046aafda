#!/usr/bin/env bash
# Regenerates reports/matrix/memtypes.{md,json} and reports/matrix/allocation.{md,json}: the version
# matrix of issue 24's corpus files over the pins that have their memory classes, without the
# 50-pin run of scripts/matrix.sh. memtypes: every corpus file whose setup runs one of the classes
# issue 24 added (minimax-m3: MSA from 0.1.155; deepseek4: DSV4 from 0.1.154; qwen4exp(_ple):
# hybrid-idx, glm-dsa/deepseek32: DSA, dots3note: DSA-iSWA, from 0.1.157 (DSA from 0.1.147, running
# from 0.1.157); lfm2_swa: hybrid-iSWA from 0.1.137) on 0.1.154..0.1.161; a version without the
# class shows `u` (its setup is unsupported there). allocation: the #19552 file on 0.1.133..0.1.138,
# around its fix. Pins not built are built first (2 to 8 minutes each).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
mkdir -p reports/matrix
files=$(grep -l -E '"arch": ?"(minimax-m3|qwen4exp|qwen4exp_ple|deepseek4|glm-dsa|deepseek32|dots3note|lfm2_swa)"' corpora/*.json)
# Exit 3 means some cell could not be judged (a pin that does not build): the table says which.
nice -n 19 $k matrix $files --targets 0.1.154..0.1.161 \
  --markdown reports/matrix/memtypes.md --json reports/matrix/memtypes.json || [ $? -eq 3 ]
nice -n 19 $k matrix corpora/allocation_hybrid_attention_cache_of_n_ctx_per_stream.json \
  --targets 0.1.133..0.1.138 \
  --markdown reports/matrix/allocation.md --json reports/matrix/allocation.json || [ $? -eq 3 ]
