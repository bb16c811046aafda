#!/usr/bin/env bash
# Regenerates the measured figures of docs/performance.md from the benchmarks, so that no figure
# there is typed by hand. Each bench's section lies between `<!-- figures:NAME:begin -->` and
# `<!-- figures:NAME:end -->` and is rewritten whole: a table parsed from the bench's output, the
# output itself, and the date, commit and machine of the run.
#
#   scripts/docs-figures.sh                  # every bench: audit, theorems, llama, limit
#   scripts/docs-figures.sh audit theorems   # only these sections; the others stay as they are
#
# The llama bench needs the release pins llama.cpp@0.1.156 and @0.1.161. They are found in the
# cache or built (`kvaudit target build`, a few minutes per pin); when that fails, the llama
# section says so instead of keeping stale figures.
set -euo pipefail
cd "$(dirname "$0")/.."

doc=docs/performance.md
all=(audit theorems llama limit)
if [ $# -eq 0 ]; then set -- "${all[@]}"; fi
for name in "$@"; do
  case " ${all[*]} " in
    *" $name "*) ;;
    *) echo "docs-figures: unknown section '$name' (known: ${all[*]})" >&2; exit 2 ;;
  esac
  grep -q "<!-- figures:$name:begin -->" "$doc" || {
    echo "docs-figures: $doc has no <!-- figures:$name:begin --> marker" >&2
    exit 2
  }
done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# What the figures were measured on. A change outside docs/ that is not committed would make the
# commit a lie, so it is named.
commit=$(git rev-parse --short=12 HEAD)
if ! git diff --quiet HEAD -- . ':(exclude)docs'; then commit="$commit plus uncommitted changes"; fi
{
  echo "date=$(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit=$commit"
  echo "nproc=$(nproc)"
  echo "cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "rustc=$(rustc --version)"
} >"$out/machine"

cargo build --release --benches --bin kvaudit

for name in "$@"; do
  cut -d' ' -f1 /proc/loadavg >"$out/$name.load"
  case "$name" in
    audit | theorems)
      echo "docs-figures: cargo bench --bench $name" >&2
      cargo bench --bench "$name" | tee "$out/$name.txt"
      ;;
    llama | limit)
      pins=(llama.cpp@0.1.156 llama.cpp@0.1.161)
      if ! ./target/release/kvaudit target build "${pins[@]}" >"$out/llama.build" 2>&1; then
        cat "$out/llama.build" >&2
        echo "docs-figures: the llama.cpp pins (${pins[*]}) are not built and could not be built: the llama section says so" >&2
        { echo "The llama.cpp pins (${pins[*]}) were not available: \`kvaudit target build\` failed with"
          tail -3 "$out/llama.build"; } >"$out/$name.skipped"
      else
        if [ "$name" = llama ]; then args=(--skip-limit); else args=(--pin 0.1.161 --only limit); fi
        echo "docs-figures: cargo bench --bench llama -- ${args[*]}" >&2
        if ! cargo bench --bench llama -- "${args[@]}" | tee "$out/$name.txt"; then
          echo "The llama bench failed; its output up to the failure is below." >"$out/$name.skipped"
        fi
      fi
      ;;
  esac
done

python3 - "$doc" "$out" "$@" <<'PY'
"""Rewrites the figures sections of docs/performance.md from the bench outputs in OUT."""
import pathlib
import re
import sys

doc, out, names = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
machine = dict(line.split("=", 1) for line in (out / "machine").read_text().splitlines())


def num(s):
    """A bench figure with thousands separators, as the docs write numbers."""
    v = float(s)
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"


def audit_rows(text):
    rows = ["| depth | trials | seconds | trials/s |", "|---:|---:|---:|---:|"]
    for d, n, s, r in re.findall(r"^depth (\d+):\s+(\d+) trials in\s+([\d.]+) s =\s+([\d.]+) trials/s", text, re.M):
        rows.append(f"| {d} | {num(n)} | {s} | {num(r)} |")
    ratios = re.findall(r"^depth (\d+): default oracles\s+([\d.]+) s, --oracles I1,I2,crash\s+([\d.]+) s: ratio ([\d.]+); CPU ([\d.]+) s and ([\d.]+) s: ratio ([\d.]+)", text, re.M)
    if ratios:
        rows += ["", "| depth | default oracles | `--oracles I1,I2,crash` | default / basic (wall) | CPU: default, basic | default / basic (CPU) |", "|---:|---:|---:|---:|---:|---:|"]
        rows += [f"| {d} | {a} s | {b} s | {r}x | {ca} s, {cb} s | {rc}x |" for d, a, b, r, ca, cb, rc in ratios]
    return rows


def theorems_rows(text):
    rows = ["| what | figure |", "|---|---:|"]
    for d, n, s, r in re.findall(r"^audit depth (\d+):\s+(\d+) trials in\s+([\d.]+) s =\s+([\d.]+) trials/s", text, re.M):
        rows.append(f"| audit, depth {d}: {num(n)} trials in {s} s | {num(r)} trials/s |")
    for what, r in re.findall(r"^(T[123] [^:]+):\s+([\d.]+) checks/s", text, re.M):
        rows.append(f"| {what} | {num(r)} checks/s |")
    return rows


def llama_rows(text):
    rows = [
        "| pin | audit, 1 worker | audit, all workers: total (per worker) | in process, restore resets | naive | restore / naive | depth-2 `seed` | depth-2 `server` |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    pins = sorted(set(re.findall(r"^(llama\.cpp@[\w.+]+):", text, re.M)))
    for pin in pins:
        p = re.escape(pin)
        audits = re.findall(p + r": depth-3 seed audit, (\d+) worker process\(es\): \d+ trials in ([\d.]+) s = ([\d.]+) trials/s \(([\d.]+) per worker\)", text)
        one = next((f"{num(r)}/s, {s} s" for w, s, r, _ in audits if w == "1"), "-")
        many = next((f"{num(r)}/s ({num(pw)}), {s} s, {w} workers" for w, s, r, pw in audits if w != "1"), "-")
        fast = re.search(p + r": in process, restore resets: ([\d.]+) trials/s", text)
        naive = re.search(p + r": in process, naive [^:]*: ([\d.]+) trials/s", text)
        ratio = re.search(p + r": restore resets / naive = ([\d.]+)x", text)
        cell = lambda m, unit="/s": f"{num(m.group(1))}{unit}" if m else "-"
        preset = lambda name: re.search(p + r": depth-2 " + name + r" audit, \d+ worker process\(es\): \d+ trials in [\d.]+ s = ([\d.]+) trials/s", text)
        rows.append(f"| {pin.split('@')[1]} | {one} | {many} | {cell(fast)} | {cell(naive)} | {ratio.group(1) + 'x' if ratio else '-'} | {cell(preset('seed'))} | {cell(preset('server'))} |")
    return rows


def limit_rows(text):
    rows = ["| depth | bare C loop, 1 process | bare C loop, all cores | audit `--oracles I1,I2,crash`, all workers | audit / bare (all cores) | 2 shards: slower shard |", "|---:|---:|---:|---:|---:|---:|"]
    for d in sorted(set(re.findall(r": depth-(\d+) bare C loop", text))):
        one = re.search(r": depth-" + d + r" bare C loop, 1 process: (\d+) trials in ([\d.]+) s", text)
        many = re.search(r": depth-" + d + r" bare C loop, \d+ processes: \d+ trials in ([\d.]+) s", text)
        audit = re.search(r": depth-" + d + r" audit --oracles I1,I2,crash, \d+ workers: \d+ trials in ([\d.]+) s = \d+ trials/s; ([\d.]+)x", text)
        shards = re.search(r": depth-" + d + r" the same audit as 2 shards .*: ([\d.]+) s on 2 machines", text)
        cell = lambda m, g=1, unit=" s": m.group(g) + unit if m else "-"
        rows.append(f"| {d} ({num(one.group(1)) if one else '?'} trials) | {cell(one, 2)} | {cell(many)} | {cell(audit)} | {cell(audit, 2, 'x')} | {cell(shards)} |")
    default = re.search(r": depth-3 audit, default oracles, \d+ workers: \d+ trials in ([\d.]+) s = (\d+) trials/s, beside the bare loop's (\d+) trials/s \(([\d.]+)x its time\) and the basic audit's (\d+) trials/s", text)
    if default:
        rows += ["", f"Depth 3 with the default oracles: {num(default.group(2))} trials/s ({default.group(1)} s), beside the bare loop's {num(default.group(3))} trials/s ({default.group(4)}x its time) and the basic audit's {num(default.group(5))} trials/s. Per oracle of the default set, audited with I1, I2 and crash (wall times: under load they move by more than the smaller gaps):", "",
                 "| oracle | observes beyond the basic | seconds | over the basic audit |", "|---|---|---:|---:|"]
        for name, what, secs, over, ratio in re.findall(r": depth-3 gap, I1,I2,crash \+ (\S+)\s+\(observes ([^)]*?)\s*\): \d+ trials in ([\d.]+) s, ([+-][\d.]+) s over the basic audit \(([\d.]+)x\)", text):
            rows.append(f"| {name} | {what} | {secs} s | {over} s ({ratio}x) |")
    return rows


NOTE = "> **Not measured again**"
parsers = {"audit": audit_rows, "theorems": theorems_rows, "llama": llama_rows, "limit": limit_rows}
commands = {"audit": "cargo bench --bench audit", "theorems": "cargo bench --bench theorems", "llama": "cargo bench --bench llama -- --skip-limit", "limit": "cargo bench --bench llama -- --pin 0.1.161 --only limit"}

text = doc.read_text()
for name in names:
    bench = (out / f"{name}.txt").read_text() if (out / f"{name}.txt").exists() else ""
    load = (out / f"{name}.load").read_text().strip()
    lines = [
        f"Generated by `scripts/docs-figures.sh` from `{commands[name]}` on {machine['date']}, "
        f"commit {machine['commit']}, {machine['nproc']} cores ({machine['cpu']}), {machine['rustc']}. "
        f"The machine is shared with other jobs (load average {load} when the bench started), so "
        "figures vary from run to run; rerun the script to measure yours.",
        "",
    ]
    begin, end = f"<!-- figures:{name}:begin -->", f"<!-- figures:{name}:end -->"
    pattern = re.compile(re.escape(begin) + r"\n?(.*?)" + re.escape(end), re.S)
    found = pattern.search(text)
    if not found:
        sys.exit(f"docs-figures: {doc}: no {begin} ... {end} section")
    skipped = out / f"{name}.skipped"
    if skipped.exists():
        note = NOTE + f" on {machine['date']} (commit {machine['commit']}): " + " ".join(skipped.read_text().split())
        if bench:
            lines = [note, ""] + lines
        else:
            # Keep the last run's figures, under a note that says they were not measured again.
            earlier = [l for l in found.group(1).rstrip("\n").splitlines() if not l.startswith(NOTE)]
            while earlier and not earlier[0]:
                earlier.pop(0)
            lines = [note + " The figures below, if any, are those of the earlier run they name.", "", *earlier]
    if bench:
        lines += parsers[name](bench) + ["", "The bench's output:", "", "```text", *bench.rstrip("\n").splitlines(), "```"]
    text = pattern.sub(lambda _: "\n".join([begin, *lines, end]), text, count=1)
    print(f"docs-figures: {doc}: section {name} rewritten", file=sys.stderr)
doc.write_text(text)
PY
