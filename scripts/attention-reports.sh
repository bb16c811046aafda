#!/usr/bin/env bash
# Regenerates the committed reports of issue 10 (llama.cpp's attention-cache surface) in
# reports/attention/: depth-2 audits of every new preset on both release pins (server also at
# depth 3), the server and seqids presets against the native cache, the configuration
# differential (seed, unified vs one stream per sequence, flash attention off vs on, n_ubatch
# default vs 1), and timed fuzz runs with state ops
# under one stream per sequence. Every audit report compares its outcome with PREREG.md.
# Takes about 10 minutes on 2 cores. Exit code 1 of an audit (findings) is expected.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
k=./target/release/kvaudit
out=reports/attention
mkdir -p "$out"
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
for pin in 0.1.156 0.1.161; do
  t="llama.cpp@$pin"
  for p in server streams state flags batch full flash quant seqids; do
    run "$t-$p-d2" --target "$t" --domain "$p" --depth 2
  done
  run "$t-server-d3" --target "$t" --domain server --depth 3
  for p in server seqids; do
    run "$t-vs-native-$p-d2" --target "$t" --vs native --domain "$p" --depth 2
  done
  run "$t-vs-streams-seed-d2" --target "$t" --vs-config kv_unified=false --domain seed --depth 2
  run "$t-vs-flash-seed-d2" --target "$t" --vs-config flash_attn=on --domain seed --depth 2
  run "$t-vs-ubatch1-seed-d2" --target "$t" --vs-config n_ubatch=1 --domain seed --depth 2
  $k fuzz --target "$t" --state --config kv_unified=false --seed 10 --time 90s --no-repros -q \
    --out "$out/$t-fuzz-state-streams.json" >/dev/null || [ $? -eq 1 ]
  # The cache-invisible oracle (PREREG.md, fifth batch): asked by name in an audit.
  run "$t-cache-invisible-seed-d2" --target "$t" --domain seed --depth 2 \
    --oracles I1,I2,cache-invisible
  $k fuzz --target "$t" --seed 1 --cases 300 --no-repros -q \
    --out "$out/$t-fuzz-cache-invisible.json" >/dev/null || [ $? -eq 1 ]
  $k fuzz --target "$t" --config kv_unified=false --seed 1 --cases 300 --no-repros -q \
    --out "$out/$t-fuzz-cache-invisible-streams.json" >/dev/null || [ $? -eq 1 ]
done
