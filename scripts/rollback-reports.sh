#!/usr/bin/env bash
# Regenerates the committed reports of recurrent rollback (issue 24) in reports/rollback/: the
# rollback preset (lfm2, n_rs_seq 3) on 0.1.161 at depths 2 (compared with PREREG.md, issue-24
# batch) and 3, on native with and without the positive control's fault, and the fuzz runs that
# measured lfm2's probes (without rollback) and ran the rollback oracle. 0.1.156 has no
# architecture kvaudit writes that rolls back (llama::unsupported_rollback_0.1.156). A few
# minutes on 2 cores. Exit code 1 (findings) is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/rollback
mkdir -p "$out"
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
oracles=I1,I2,crash,conservation,round-trip,contract,contract?,cache-invisible,rollback
t=llama.cpp@0.1.161
run "rollback-0.1.161-d2" --target "$t" --domain rollback --depth 2 --oracles "$oracles"
run "rollback-0.1.161-d3" --target "$t" --domain rollback --depth 3 --oracles "$oracles"
# The state preset with rollback (`audit --config`): mamba and jamba clamp n_rs_seq to 0 (every
# trial unsupported), lfm2 rolls back; its default oracles.
for arch in mamba jamba lfm2; do
  run "state-$arch-n_rs_seq-3-0.1.161-d2" --target "$t" --arch "$arch" --domain state \
    --config n_rs_seq=3 --depth 2
done
probes=rollback,cache-invisible,conservation,round-trip
run "rollback-native-d2" --target native --domain rollback --depth 2 --oracles "$probes"
run "rollback-native-stale-plane-d2" --target native --inject rollback_reads_stale_plane \
  --domain rollback --depth 2 --oracles "$probes"
for cfg in arch=lfm2 arch=lfm2,n_rs_seq=3; do
  $k fuzz --target "$t" --seed 1 --cases 300 --config "$cfg" --oracles cache-invisible,rollback \
    --shrink-budget 1 --no-repros -q --out "$out/$t-fuzz-${cfg//[=,]/-}.json" >/dev/null || [ $? -eq 1 ]
done
