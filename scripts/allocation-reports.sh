#!/usr/bin/env bash
# Regenerates reports/allocation/: the allocation oracle (issue 24 item 3; upstream #19552, fixed
# by #19559) on the pins around the fix, depth 1 (what a memory allocates is fixed when its
# context is made, so every op shows it): the hybrid preset (jamba) with one KV stream per
# sequence on 0.1.135 and 0.1.136 (attention cache made with n_ctx cells per stream), 0.1.137 (the
# first pin with n_ctx_seq) and the release pins; the unified hybrid preset and the plain streams
# preset on 0.1.135; every preset on 0.1.156 and 0.1.161. PREREG.md: "what the memory allocates".
# Builds the pins it needs on first use (0.1.135-0.1.137: a few minutes each on 2 cores).
# Exit code 1 (findings) is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/allocation
mkdir -p "$out"
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
for pin in 0.1.135 0.1.136 0.1.137 0.1.156 0.1.161; do
  run "llama.cpp@$pin-hybrid-streams-d1" --target "llama.cpp@$pin" --domain hybrid \
    --config kv_unified=false --depth 1 --oracles allocation
done
run "llama.cpp@0.1.135-hybrid-d1" --target llama.cpp@0.1.135 --domain hybrid --depth 1 --oracles allocation
run "llama.cpp@0.1.135-streams-d1" --target llama.cpp@0.1.135 --domain streams --depth 1 --oracles allocation
for pin in 0.1.156 0.1.161; do
  for p in seed streams iswa recurrent hybrid hybrid_iswa msa dsv4; do
    run "llama.cpp@$pin-$p-d1" --target "llama.cpp@$pin" --domain "$p" --depth 1 --oracles allocation
  done
done
# The memories 0.1.156 cannot run (hybrid_idx from 0.1.157, dsa and dsa_iswa run from 0.1.157) and
# rollback (n_rs_seq, refused before 0.1.157).
for p in dsa dsa_iswa hybrid_idx rollback; do
  run "llama.cpp@0.1.161-$p-d1" --target llama.cpp@0.1.161 --domain "$p" --depth 1 --oracles allocation
done
