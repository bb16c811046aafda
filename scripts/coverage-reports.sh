#!/bin/bash
# Regenerates reports/coverage/: the memory code of llama.cpp@0.1.161 reached by a guided fuzz
# run and a short hunt on its `+cov` build (docs/usage.md, "kvaudit coverage"): the table per
# file (coverage.md, coverage.json), the instrumented lines no run reached (unreached.md) and
# an annotated HTML page per file. reports/coverage/README.md (by hand) groups the unreached
# lines with a reason.
#
#   scripts/coverage-reports.sh                      # fuzz 5m (with state ops), hunt 10m
#   FUZZ_TIME=1m HUNT_BUDGET=0 scripts/coverage-reports.sh   # the fuzz run alone, short
#   HUNT_BUDGET=30m scripts/coverage-reports.sh     # the committed hunt's budget (reports/hunt/)
#   KVAUDIT=/tmp/copy/kvaudit scripts/coverage-reports.sh   # that binary (named kvaudit), no build
#   REUSE_RUNS=1 scripts/coverage-reports.sh        # keep fuzz.json and hunt/, rerun hunt-extra/
#
# hunt-extra/ is a short hunt of the entries added for coverage (EXTRA_ENTRIES, EXTRA_BUDGET):
# the refusals of dumps of other configurations, a decode larger than a stream and the PLE
# model, with token ids and with embedding inputs (embd_input). The full hunt's plan has them
# too; a hunt of 30 minutes gives each a share of about 25 s, so they run apart as well.
# EXTRA_BUDGET=0 skips it.
#
# Exit code 1 of the fuzz run or the hunt (findings) is expected; any other failure stops the
# script.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_time=${FUZZ_TIME:-5m}
hunt_budget=${HUNT_BUDGET:-10m}
extra_budget=${EXTRA_BUDGET:-14m}
extra_entries=${EXTRA_ENTRIES:-small-ctx,state+foreign,quant+foreign,state+flash+foreign,state+foreign-layers,state+foreign-cells,hybrid_idx+ple,hybrid_idx+ple+embd}
reuse=${REUSE_RUNS:-0}
pin=llama.cpp@0.1.161+cov
out=reports/coverage
# KVAUDIT=PATH runs that binary (a copy, so that a rebuild does not pull it from under a hunt).
if [ -z "${KVAUDIT:-}" ]; then
  cargo build --release --quiet
fi
k=${KVAUDIT:-target/release/kvaudit}
$k target build "$pin"
mkdir -p "$out"
find "$out" -maxdepth 1 \( -name '*.html' -o -name 'coverage.*' -o -name 'unreached.md' \) -delete
runs=()
if [ "$reuse" != 1 ]; then
  $k fuzz --target "$pin" --generator guided --state --time "$fuzz_time" --seed 1 --no-repros \
    --format json --out "$out/fuzz.json" > /dev/null || [ $? -eq 1 ]
fi
runs+=("$out/fuzz.json")
if [ "$reuse" = 1 ]; then
  runs+=("$out/hunt")
elif [ "$hunt_budget" != 0 ]; then
  rm -rf "$out/hunt"
  $k hunt --target "$pin" --budget "$hunt_budget" --out "$out/hunt" --seed 1 \
    > "$out/hunt-terminal.txt" || [ $? -eq 1 ]
  runs+=("$out/hunt")
fi
if [ "$extra_budget" != 0 ]; then
  rm -rf "$out/hunt-extra"
  $k hunt --target "$pin" --entries "$extra_entries" --budget "$extra_budget" \
    --out "$out/hunt-extra" --seed 1 > "$out/hunt-extra-terminal.txt" || [ $? -eq 1 ]
  runs+=("$out/hunt-extra")
fi
$k coverage "${runs[@]}" --out "$out" | tee "$out/terminal.txt"
