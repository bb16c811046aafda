#!/usr/bin/env bash
# Regenerates the committed reports of the reload oracles (issue 23: round-trip-logits and
# save-load-invisible) in reports/reload/: on both release pins, the depth-2 audit of the state
# preset (compared with PREREG.md, issue-23 batch), the same without seq_add/seq_div
# (reports/reload/state-noshift.toml), and the fuzz runs that measured the tolerances (the
# reports' `fuzz.reload_probes`). A minute or two on 2 cores. Exit code 1 (findings) is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/reload
mkdir -p "$out"
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
oracles=round-trip-logits,save-load-invisible
for pin in 0.1.156 0.1.161; do
  t="llama.cpp@$pin"
  run "$t-state-d2" --target "$t" --domain state --depth 2 --oracles "$oracles"
  run "$t-state-noshift-d2" --target "$t" --domain "$out/state-noshift.toml" --depth 2 \
    --oracles "$oracles"
  for cfg in kv_unified=true kv_unified=false type_k=f32,type_v=f32 arch=gemma2 arch=mamba \
    arch=jamba; do
    $k fuzz --target "$t" --seed 1 --cases 300 --state --config "$cfg" --oracles "$oracles" \
      --shrink-budget 1 --no-repros -q --out "$out/$t-fuzz-${cfg//[=,]/-}.json" >/dev/null || [ $? -eq 1 ]
  done
done
