#!/usr/bin/env bash
# Regenerates reports/fixes/: each fix of corpora/fixes/ (or the ones named) checked on the pin
# its JSON names (`check_on`): the pin built with the fix (`llama.cpp@0.1.161+fix:NAME`, from the
# object cache: only the sources the patch reaches compile, then a link), every corpus file run on
# it and on the pin without it; the fix's files must go from failing to holding and every other
# run end as on the pin. Writes reports/fixes/NAME.md (every run on both builds), records the
# result in corpora/fixes/NAME.json ("checked", with the patch's sha256), and lists all results
# in reports/fixes/summary.md. A fix that fails stays failing in its record: move it back to
# notes/issue45/patches/ with the reason, or revise the patch and run this again.
# The records are built into kvaudit: rebuild (`cargo build --release`) after this script, so
# that `kvaudit report-bug` and tests/it/fixes.rs read them.
# Exit code: 0 when every fix checked passed, 1 when one failed, 3 when a build or run broke.
set -uo pipefail
cd "$(dirname "$0")/.."
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release || exit 3; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/fixes
mkdir -p "$out"
if [ $# -gt 0 ]; then
  names=("$@")
else
  names=()
  for p in corpora/fixes/*.patch; do names+=("$(basename "$p" .patch)"); done
fi
status=0
for name in "${names[@]}"; do
  started=$(date +%s)
  "$k" fixes check "$name" --report-dir "$out" --record corpora/fixes >"$out/.$name.out" 2>&1
  rc=$?
  seconds=$(($(date +%s) - started))
  echo "$name: exit $rc, ${seconds} s (build and both runs)"
  grep "^$name: " "$out/.$name.out" | head -1
  if [ $rc -eq 1 ] && [ $status -eq 0 ]; then status=1; fi
  if [ $rc -gt 1 ]; then
    status=3
    tail -3 "$out/.$name.out"
  fi
  rm -f "$out/.$name.out"
done
# The summary: every fix's recorded result (the records just written, read back from the JSON).
{
  echo "# Fixes checked (scripts/fixes-check.sh)"
  echo
  echo "Each fix of corpora/fixes/ built into its pin and checked against the whole corpus; one"
  echo "report per fix beside this file. Drafts that did not pass stay in notes/issue45/patches/"
  echo "with the reason in notes/issue45/fixes-not-kept.md."
  echo
  echo "| fix | root cause | checked on | files | result |"
  echo "|---|---|---|---|---|"
  for p in corpora/fixes/*.json; do
    python3 - "$p" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
c = d.get("checked") or {}
print(f"| [`{d['name']}`]({d['name']}.md) | {d['root_cause']} | `{d['check_on']}` | "
      f"{len(d['files'])} | {c.get('result', 'not checked')} ({c.get('date', '-')}) |")
PY
  done
} >"$out/summary.md"
exit $status
