#!/usr/bin/env bash
# Regenerates the committed reports of issue 11 (llama.cpp's other memory types) in
# reports/memtypes/: depth-2 audits of the iswa (gemma2), recurrent (mamba), hybrid (jamba) and
# hybrid_iswa (lfm2_swa), msa (minimax-m3), dsv4 (deepseek4) and dsa_iswa (dots3note, all issue 24) presets on both release pins, the same against the native model, and fuzz runs of each
# architecture (with the logits probe). Every audit report compares its outcome with PREREG.md
# (the issue 11 batch; hybrid_iswa, msa: the issue-24 batches). Takes a few minutes on 2 cores. Exit code 1 (findings) is expected.
#
# Usage: scripts/memtypes-reports.sh [GROUP...]. With no argument every group runs (the default);
# with arguments only the groups named, in the script's order whatever the arguments' order:
#   iswa, recurrent, hybrid   the preset's audits (alone, vs native) and its architecture's fuzz run
#                             (gemma2, mamba, jamba) on 0.1.156 and 0.1.161
#   hybrid_iswa               the same (lfm2_swa) on 0.1.156 and 0.1.161, and 0.1.137's runs
#   msa                       the same and the msa-logits audit and minimax-m3 fuzz run on 0.1.156
#                             and 0.1.161, and 0.1.155's runs
#   dsa, dsv4, hybrid_idx, dsa_iswa   that memory's runs on its pins
#   partial                   every partial-restore run; partial-PRESET (partial-hybrid_iswa, ...)
#                             only that preset's
# e.g. `KVAUDIT=/tmp/k/kvaudit scripts/memtypes-reports.sh hybrid_iswa dsa_iswa`. An unknown name
# stops the script before any run.
set -euo pipefail
cd "$(dirname "$0")/.."
groups=" $* "
for g in "$@"; do
  case "$g" in
    iswa|recurrent|hybrid|hybrid_iswa|msa|dsa|dsv4|hybrid_idx|dsa_iswa|partial|partial-hybrid|partial-hybrid_iswa|partial-iswa) ;;
    *) echo "memtypes-reports.sh: unknown group '$g'" >&2; exit 2 ;;
  esac
done
# want GROUP: whether GROUP runs (every group when none is named).
want() { [ -z "${groups// /}" ] || [[ "$groups" == *" $1 "* ]]; }
# KVAUDIT=PATH runs a copy of the binary, kvaudit-llama-worker beside it (so that a rebuild meanwhile
# cannot swap them).
if [ -z "${KVAUDIT:-}" ]; then cargo build --release; fi
k=${KVAUDIT:-./target/release/kvaudit}
out=reports/memtypes
mkdir -p "$out"
. scripts/report-run.sh # run NAME ARGS...: JSON and Markdown reports of one audit
for pin in 0.1.156 0.1.161; do
  t="llama.cpp@$pin"
  for p in iswa recurrent hybrid hybrid_iswa msa; do
    want "$p" || continue
    run "$t-$p-d2" --target "$t" --domain "$p" --depth 2
    run "$t-vs-native-$p-d2" --target "$t" --vs native --domain "$p" --depth 2
  done
  for pa in iswa:gemma2 recurrent:mamba hybrid:jamba hybrid_iswa:lfm2_swa; do
    want "${pa%%:*}" || continue
    arch=${pa#*:}
    $k fuzz --target "$t" --config "arch=$arch" --seed 1 --cases 300 --no-repros -q \
      --out "$out/$t-fuzz-$arch.json" >/dev/null || [ $? -eq 1 ]
  done
  want msa || continue
  # The msa preset with the logits oracles too (block selection is judged only by them).
  run "$t-msa-logits-d2" --target "$t" --domain msa --depth 2 \
    --oracles I1,I2,crash,conservation,round-trip,contract,contract?,cache-invisible,round-trip-logits,save-load-invisible
  # minimax-m3 under the msa preset's configuration: block selection needs flash attention and
  # one stream per sequence; F32 K/V so that the logits probes are judged.
  $k fuzz --target "$t" --config arch=minimax-m3,flash_attn=on,kv_unified=false,type_k=f32,type_v=f32 \
    --seed 1 --cases 300 --no-repros -q --out "$out/$t-fuzz-minimax-m3.json" >/dev/null || [ $? -eq 1 ]
done
# The oldest pin with llama_memory_hybrid_iswa (issue 24). swa-window is left out there: 0.1.137's
# windowed dump writes every cell of the windowed cache, masked ones too, where the oracle's rule
# 2 reads the masked dump of 0.1.156 and later (docs/results.md, hybrid-iSWA).
if want hybrid_iswa; then
t=llama.cpp@0.1.137
o137="I1,I2,crash,conservation,round-trip,contract,contract?"
run "$t-hybrid_iswa-d2" --target "$t" --domain hybrid_iswa --depth 2 --oracles "$o137"
$k fuzz --target "$t" --config arch=lfm2_swa --seed 1 --cases 300 --no-repros -q \
  --oracles "$o137,cache-invisible,round-trip-logits,save-load-invisible" \
  --out "$out/$t-fuzz-lfm2_swa.json" >/dev/null || [ $? -eq 1 ]
fi
# llama_kv_cache_dsa (issue 24): glm-dsa (a full and a shared indexer layer) and deepseek32 on 0.1.161
# and 0.1.157, the oldest pin that runs the class: 0.1.147 (the oldest with it) to 0.1.156 abort in
# llama_init_from_model on both tiny models (corpora/crash_dsa_indexer_nope_view_aborts_context_creation.json).
for pin in 0.1.161 0.1.157; do
  want dsa || break
  t="llama.cpp@$pin"
  run "$t-dsa-d2" --target "$t" --domain dsa --depth 2
  run "$t-vs-native-dsa-d2" --target "$t" --vs native --domain dsa --depth 2
  run "$t-dsa_full-d2" --target "$t" --domain dsa_full --depth 2
  $k fuzz --target "$t" --config arch=glm-dsa,type_k=f32,type_v=f32 --seed 1 --cases 300 --no-repros -q \
    --out "$out/$t-fuzz-glm-dsa.json" >/dev/null || [ $? -eq 1 ]
done
# 0.1.155: the oldest published pin with llama_kv_cache_msa (0.1.154 keeps MSA inside
# llama_kv_cache); the msa preset only.
if want msa; then
t=llama.cpp@0.1.155
run "$t-msa-d2" --target "$t" --domain msa --depth 2
run "$t-vs-native-msa-d2" --target "$t" --vs native --domain msa --depth 2
$k fuzz --target "$t" --config arch=minimax-m3,flash_attn=on,kv_unified=false,type_k=f32,type_v=f32 \
  --seed 1 --cases 300 --no-repros -q --out "$out/$t-fuzz-minimax-m3.json" >/dev/null || [ $? -eq 1 ]
fi
# dsv4 (deepseek4, issue 24): 0.1.161; 0.1.156, whose state_read clears every sequence's
# compressed K caches (#26790, fixed by 0.1.157); 0.1.154, the oldest pin with
# llama_kv_cache_dsv4. The fuzz runs take deepseek4 under the dsv4 preset's configuration (F32 K,
# whole copies only: a range copy is the known abort of corpora/crash_dsv4_partial_seq_cp_aborts.json,
# so that the logits probes are judged) with the state ops.
for pin in 0.1.161 0.1.156 0.1.154; do
  want dsv4 || break
  t="llama.cpp@$pin"
  run "$t-dsv4-d2" --target "$t" --domain dsv4 --depth 2
  # With the logits oracles: the compressed parts are judged only by them.
  run "$t-dsv4-logits-d2" --target "$t" --domain dsv4 --depth 2 \
    --oracles I1,I2,crash,conservation,round-trip,contract,contract?,cache-invisible,round-trip-logits,save-load-invisible,state-size,failed-restore
  $k fuzz --target "$t" --config arch=deepseek4,kv_unified=false,type_k=f32,type_v=f32 --state \
    --whole-copies --seed 1 --cases 300 --no-repros -q --out "$out/$t-fuzz-deepseek4.json" >/dev/null || [ $? -eq 1 ]
done
# llama_memory_hybrid_idx (qwen4exp, issue 24): 0.1.161 and 0.1.157, the oldest pin with the
# class; alone and against the native model (its dump in llama.cpp's layout: cell exts, a
# K-only indexer cache).
for pin in 0.1.161 0.1.157; do
  want hybrid_idx || break
  t="llama.cpp@$pin"
  run "$t-hybrid_idx-d2" --target "$t" --domain hybrid_idx --depth 2
  run "$t-vs-native-hybrid_idx-d2" --target "$t" --vs native --domain hybrid_idx --depth 2
  # The generator draws no seq_add/seq_div for qwen4exp (Arch::can_shift: an M-RoPE cache asserts).
  $k fuzz --target "$t" --config arch=qwen4exp,type_k=f32,type_v=f32 --state \
    --seed 1 --cases 300 --no-repros -q --out "$out/$t-fuzz-qwen4exp.json" >/dev/null || [ $? -eq 1 ]
done
# llama_kv_cache_dsa_iswa (dots3note, issue 24): 0.1.161 and 0.1.157, the oldest pin with the
# class (0.1.156 has no llama-kv-cache-dsa-iswa.cpp); alone and against the native model, and a
# fuzz run of dots3note under the preset's F32 K/V.
for pin in 0.1.161 0.1.157; do
  want dsa_iswa || break
  t="llama.cpp@$pin"
  run "$t-dsa_iswa-d2" --target "$t" --domain dsa_iswa --depth 2
  run "$t-vs-native-dsa_iswa-d2" --target "$t" --vs native --domain dsa_iswa --depth 2
  $k fuzz --target "$t" --config arch=dots3note,type_k=f32,type_v=f32 --seed 1 --cases 300 --no-repros -q \
    --out "$out/$t-fuzz-dots3note.json" >/dev/null || [ $? -eq 1 ]
done
# partial-restore (issue 24, upstream #18552): the PARTIAL_ONLY checkpoint taken up twice after one
# more decode, on the memories with a partial part, both release pins (PREREG.md, partial-restore batch).
for pin in 0.1.161 0.1.156; do
  for p in hybrid hybrid_iswa iswa; do
    want partial || want "partial-$p" || continue
    run "llama.cpp@$pin-$p-partial-d2" --target "llama.cpp@$pin" --domain "$p" --depth 2 \
      --oracles I1,crash,partial-restore
  done
done
