#!/bin/sh
# Leave-one-out on llama.cpp (notes/issue45/leave-one-out.md): the committed hunt of 0.1.161
# reclassified (`kvaudit merge`) against copies of the corpus, one per root cause: its files
# (the fix's `files` and `also_fixes`) left out, and its fix left out too (`without-fix`) or
# kept (`with-fix`); plus the whole corpus with and without its fixes. Prints one line a run:
# groups, new groups, groups known by fix, new groups the left-out fix explains.
# Usage, from the repository's root: notes/issue45/leave-one-out.sh OUT FIX...
set -eu
kvaudit=${KVAUDIT:-target/release/kvaudit}
hunt=reports/hunt/llama.cpp@0.1.161
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
      f"new explained by the left-out fix {len(by_left)} (merged from {len(by_left) + merged})")
PY
}
corpus() { # folder, fix to leave out ("-": none), keep its fix (yes/no), keep any fix (yes/no)
    rm -rf "$1"
    mkdir -p "$1"
    cp corpora/*.json "$1/"
    if [ "$4" = yes ]; then
        mkdir -p "$1/fixes"
        cp corpora/fixes/*.json "$1/fixes/"
    fi
    [ "$2" = - ] && return
    for f in $(python3 -c "import json; d = json.load(open('corpora/fixes/$2.json')); print(' '.join(d['files'] + [c['file'] for c in d.get('also_fixes', [])]))"); do
        rm "$1/$f"
    done
    if [ "$3" = no ]; then rm -f "$1/fixes/$2.json"; fi
}
run() { # name, fix, keep its fix, keep any fix
    corpus "$out/corpus-$1" "$2" "$3" "$4"
    start=$(date +%s)
    "$kvaudit" merge "$hunt" --corpus "$out/corpus-$1" --out "$out/$1" >/dev/null 2>"$out/$1.err" || true
    echo "$1: $(count "$out/$1/summary.json" "$2"), $(($(date +%s) - start)) s"
}
run whole-no-fixes - yes no
run whole - yes yes
for fix in "$@"; do
    run "$fix-without-fix" "$fix" no yes
    run "$fix-with-fix" "$fix" yes yes
done
