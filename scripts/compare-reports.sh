#!/usr/bin/env bash
# Compares two kvaudit report JSONs (audit, fuzz or hunt) but for their timings: prints the
# difference and exits 1 when they differ, 0 when they agree. What is stripped before the
# comparison: every object field that is a wall-clock figure (`timing`, and any field ending in
# `elapsed_s`, `_per_s`, `found_at_s`, `first_violation_s` or `_secs`; a hunt's `share_s` is a
# budget, kept). Everything else, trial counts, findings, their order and every observed value,
# must be equal. Needs jq.
#
#   scripts/compare-reports.sh before.json after.json
#
# docs/performance.md ("Reports unchanged") runs it on the seed depth-3 audits of native and
# llama.cpp@0.1.161 and a fixed-seed fuzz run, before and after a speed change.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 BEFORE.json AFTER.json" >&2
  exit 2
fi
command -v jq >/dev/null || { echo "compare-reports: needs jq" >&2; exit 2; }
strip='walk(if type == "object" then
  with_entries(select(.key | test("^timing$|(elapsed_s|_per_s|found_at_s|first_violation_s|_secs)$") | not))
  else . end)'
a=$(mktemp) b=$(mktemp)
trap 'rm -f "$a" "$b"' EXIT
jq -S "$strip" "$1" >"$a"
jq -S "$strip" "$2" >"$b"
if diff -u --label "$1" --label "$2" "$a" "$b"; then
  echo "compare-reports: $1 and $2 agree but for timings ($(wc -c <"$a") bytes compared)"
else
  echo "compare-reports: $1 and $2 differ (above)" >&2
  exit 1
fi
