#!/bin/sh
# Leave-one-out on llama.cpp (notes/issue45/leave-one-out.md): the committed hunt of 0.1.161
# reclassified (`kvaudit merge`) against copies of the corpus, one per root cause: its files
# (the fix's `files` and `also_fixes`) left out, and its fix left out too (`without-fix`) or
# kept (`with-fix`); plus the whole corpus with and without its fixes. Prints one line a run:
# groups, new groups, groups known by fix, new groups the left-out fix explains.
# Usage, from the repository's root: notes/issue45/leave-one-out.sh OUT FIX...
set -eu
kvaudit=${KVAUDIT:-target/release/kvaudit}
hunt=${HUNT:-reports/hunt/llama.cpp@0.1.161}
out=$1
shift
mkdir -p "$out"
count() { # summary.json, the left-out fix or "-"
    python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
fix = "fix " + sys.argv[2]
cls = [g["class"]["class"] for g in s["groups"]]
new = [g for g in s["groups"] if g["class"]["class"] == "new"]
by_left = [g for g in new if any(e["remedy"] == fix for e in (g.get("by_fix") or {}).get("explained", []))]
merged = sum((g.get("by_fix") or {}).get("merged", 0) for g in by_left)
print(f"groups {len(cls)}, new {len(new)}, known by fix {cls.count('known_by_fix')}, "
      f"new explained by the left-out fix {len(by_left)} (merged from {len(by_left) + merged}); "
      f"new groups {[s['groups'].index(g) + 1 for g in new]}")
PY
}
corpus() { # folder, fix to leave out ("-": none), keep its fix (yes/no), keep any fix (yes/no)
    rm -rf "$1"
    mkdir -p "$1"
    cp corpora/*.json "$1/"
    mkdir -p "$1/decisions"
    cp corpora/decisions/*.json "$1/decisions/"
    if [ "$4" = yes ]; then
        mkdir -p "$1/fixes"
        cp corpora/fixes/*.json "$1/fixes/"
    fi
    [ "$2" = - ] && return
    # The root cause's files: the fix's `files` and `also_fixes`, and every corpus file and
    # decision whose decision names the fix's root cause.
    python3 - "$1" "$2" <<'PY'
import glob, json, os, sys
folder, name = sys.argv[1], sys.argv[2]
fix = json.load(open(f"corpora/fixes/{name}.json"))
gone = set(fix["files"]) | {c["file"] for c in fix.get("also_fixes", [])}
for path in glob.glob(f"{folder}/*.json") + glob.glob(f"{folder}/decisions/*.json"):
    d = json.load(open(path))
    dec = d if "root_cause" in d else (d.get("decision") or {})
    if os.path.basename(path) in gone or dec.get("root_cause") == fix["root_cause"]:
        os.remove(path)
PY
    if [ "$3" = no ]; then rm -f "$1/fixes/$2.json"; fi
}
run() { # name, fix, keep its fix, keep any fix
    corpus "$out/corpus-$1" "$2" "$3" "$4"
    start=$(date +%s)
    "$kvaudit" merge "$hunt" --corpus "$out/corpus-$1" --out "$out/$1" >/dev/null 2>"$out/$1.err" || true
    echo "$1: $(count "$out/$1/summary.json" "$2"), $(($(date +%s) - start)) s"
}
# WITHOUT_ONLY=1: the runs without the left-out fix only (the issue's measurement).
if [ -z "${WITHOUT_ONLY:-}" ]; then
    run whole-no-fixes - yes no
fi
run whole - yes yes
for fix in "$@"; do
    run "$fix-without-fix" "$fix" no yes
    if [ -z "${WITHOUT_ONLY:-}" ]; then
        run "$fix-with-fix" "$fix" yes yes
    fi
done
