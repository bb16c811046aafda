#!/usr/bin/env bash
# Regenerates reports/sizes/ (issue 24 item 3): the dump-size tables of `kvaudit sizes` for
# every memory type on 0.1.156 and 0.1.161 and on native (the measurements behind PREREG.md's
# "state sizes" laws and the state-size oracle's table), then the audits that judge the sizes
# and the failed restores (state-size, failed-restore) per memory type on both pins at depth 2.
# Each table's last column is what the memory allocated per configuration (the allocation
# oracle's reading); jamba on 0.1.135 shows upstream #19552 (its attention cache n_seq_max times
# the context with kv_unified false). Under a minute for the tables (SIZES_TABLES_ONLY=1 stops
# there); the audits a few minutes on 2 cores. Exit code 1 (findings) of an audit is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/sizes
mkdir -p "$out"
for t in native llama.cpp@0.1.156 llama.cpp@0.1.161; do
  for arch in llama gemma2 mamba jamba lfm2; do
    rs=0
    if [ "$arch" = lfm2 ] && [ "$t" = llama.cpp@0.1.161 ]; then rs=0,3; fi
    $k sizes --target "$t" --arch "$arch" --n-rs-seq "$rs" > "$out/sizes-$t-$arch.md"
  done
done
$k sizes --target llama.cpp@0.1.135 --arch jamba > "$out/sizes-llama.cpp@0.1.135-jamba.md"
if [ "${SIZES_TABLES_ONLY:-}" = 1 ]; then exit 0; fi
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
oracles=I1,crash,contract,contract?,state-size,failed-restore
# The damaged loads per memory type: the state preset (the one with load_truncate) per arch.
for t in llama.cpp@0.1.161 llama.cpp@0.1.156 native; do
  n=${t#llama.cpp@}
  for arch in llama gemma2 mamba jamba lfm2; do
    run "state-$arch-$n-d2" --target "$t" --domain state --arch "$arch" --depth 2 --oracles "$oracles"
  done
  for dom in iswa recurrent hybrid rollback; do
    if [ "$dom" = rollback ] && [ "$t" = llama.cpp@0.1.156 ]; then continue; fi
    run "$dom-$n-d2" --target "$t" --domain "$dom" --depth 2 --oracles "$oracles"
  done
done
