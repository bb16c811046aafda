#!/usr/bin/env bash
# Checks every corpus file's C reproducer on the release pins its expectations name: `kvaudit repro
# FILE --emit c --check --target PIN` must reproduce (exit 1) where the file expects the finding
# (`fails`) and not (exit 0) where it expects `holds`. Prints one line per file and pin and exits
# non-zero if any differs. Needs the pins (built on first use). Issue 22.
set -uo pipefail
cd "$(dirname "$0")/.."
k=${KVAUDIT:-./target/release/kvaudit}
bad=0
for f in corpora/*.json; do
  # "target expect" pairs of the file's release llama.cpp pins (no "vs", no "+assert").
  pairs=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for t in d["targets"]:
    n = t["target"]
    if n.startswith("llama.cpp@") and not n.endswith("+assert") and "vs" not in t:
        print(n, t["expect"])
' "$f")
  while read -r pin expect; do
    [ -n "$pin" ] || continue
    $k repro "$f" --emit c --check --target "$pin" > /dev/null 2>&1
    code=$?
    case "$expect:$code" in
      fails:1 | holds:0) verdict=ok ;;
      *) verdict=DIFFERS; bad=1 ;;
    esac
    echo "$(basename "$f" .json) $pin expect=$expect exit=$code $verdict"
  done <<< "$pairs"
done
exit $bad
