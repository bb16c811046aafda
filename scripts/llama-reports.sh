#!/usr/bin/env bash
# Regenerates the committed llama.cpp audit reports in reports/ (JSON and Markdown): the depth-3
# seed-domain audit of each pin and variant, and each release pin against the native cache (and
# 0.1.156 against the native cache with its refcount bug injected), and the native cache with that
# bug injected. Findings are grouped by root cause (the reports list the groups first).
# Every report compares its outcome with PREREG.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release
k=./target/release/kvaudit
# The native cache with the seed's refcount bug injected: the positive control of the
# root-cause groups (the bug is one group here and on 0.1.156).
$k audit --target native --inject refcount --domain seed --depth 3 -q --out "reports/native-refcount-seed-d3.json" || [ $? -eq 1 ]
$k audit --target native --inject refcount --domain seed --depth 3 -q --format markdown --out "reports/native-refcount-seed-d3.md" || [ $? -eq 1 ]
for pin in 0.1.156 0.1.161; do
  for variant in "" "+assert"; do
    t="llama.cpp@$pin$variant"
    $k audit --target "$t" --domain seed --depth 3 -q --out "reports/$t-seed-d3.json" || [ $? -eq 1 ]
    $k audit --target "$t" --domain seed --depth 3 -q --format markdown --out "reports/$t-seed-d3.md" || [ $? -eq 1 ]
  done
  t="llama.cpp@$pin"
  $k audit --target "$t" --vs native --domain seed --depth 3 -q --out "reports/$t-vs-native-seed-d3.json" || [ $? -eq 1 ]
  if [ "$pin" = 0.1.156 ]; then
    # The same bug injected into the native cache: both agree on every trial.
    $k audit --target "$t" --vs native --inject-b refcount --domain seed --depth 3 -q \
      --out "reports/$t-vs-native-refcount-seed-d3.json" || [ $? -eq 1 ]
  fi
  $k audit --target "$t" --vs native --domain seed --depth 3 -q --format markdown --out "reports/$t-vs-native-seed-d3.md" || [ $? -eq 1 ]
done
