#!/bin/bash
# Regenerates reports/hunt/llama.cpp@0.1.161/ and reports/hunt/llama.cpp@0.1.156/: a
# `kvaudit hunt` of each pin (docs/usage.md, "kvaudit hunt"; its terminal output in
# terminal.txt), then the shrinks its budget stopped finished and its groups classified again
# (`kvaudit merge DIR --out DIR --shrink-again 2000`, merge.txt): the summary (summary.md,
# summary.json) holds local minima, and the new groups' files (new/).
#
#   scripts/hunt-reports.sh                 # --budget 30m each (about an hour on 2 cores)
#   BUDGET=2m scripts/hunt-reports.sh       # a short hunt, to see the script work
#   PINS=0.1.156 scripts/hunt-reports.sh    # one pin only
#   KVAUDIT=/tmp/copy/kvaudit scripts/hunt-reports.sh   # that binary (named kvaudit), no build
#   MERGE_ONLY=1 scripts/hunt-reports.sh    # no hunt: the committed hunts classified again with
#                                           # the corpus, decisions and fixes built in now (also
#                                           # the old pins' hunts of reports/hunt/old/)
#
# Exit code 1 of a hunt (new or regressed groups) is expected; any other failure stops the
# script.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${BUDGET:-30m}
# KVAUDIT=PATH runs that binary (a copy, so that a rebuild does not pull it from under a hunt).
if [ -z "${KVAUDIT:-}" ]; then
  cargo build --release --quiet
fi
k=${KVAUDIT:-target/release/kvaudit}
if [ -n "${MERGE_ONLY:-}" ]; then
  dirs=()
  for pin in ${PINS:-0.1.161 0.1.156}; do dirs+=("reports/hunt/llama.cpp@$pin"); done
  [ -n "${PINS:-}" ] || dirs+=(reports/hunt/mlx-lm@0.32.2)
  for out in "${dirs[@]}"; do
    rm -rf "$out/new"
    $k merge "$out" --out "$out" --shrink-again 2000 > "$out/merge.txt" 2>&1 || [ $? -eq 1 ]
    echo "$out: $(sed -n 2p "$out/merge.txt" | cut -c1-200)"
  done
  # The old pins' 5-minute hunts (docs/results.md, Hunts on old pins): classified again only.
  [ -n "${PINS:-}" ] || for out in reports/hunt/old/llama.cpp@*; do
    rm -rf "$out/new"
    $k merge "$out" --out "$out" > "$out/merge.txt" 2>&1 || [ $? -eq 1 ]
    echo "$out: $(sed -n 2p "$out/merge.txt" | cut -c1-200)"
  done
  exit 0
fi
for pin in ${PINS:-0.1.161 0.1.156}; do
  out=reports/hunt/llama.cpp@$pin
  rm -rf "$out"
  mkdir -p "$out"
  $k hunt --target "llama.cpp@$pin" --budget "$budget" --out "$out" --seed 1 \
    > "$out/terminal.txt" || [ $? -eq 1 ]
  rm -rf "$out/new"
  $k merge "$out" --out "$out" --shrink-again 2000 > "$out/merge.txt" 2>&1 || [ $? -eq 1 ]
done
