//! The tiny `glm-dsa` and `deepseek32` models: the architectures that give llama.cpp's
//! `llama_kv_cache_dsa` (0.1.161 `create_memory`, `src/llama-model.cpp:2404-2456`; 0.1.147,
//! where the class first appears, selects it for `deepseek32` only, `llama-model.cpp:2018`): a
//! K-only MLA cache of every layer beside a lightning-indexer key cache.
//!
//! The two architectures read the same tensors (`src/models/deepseek32.cpp` and
//! `src/models/glm-dsa.cpp`, `load_arch_tensors`, 0.1.161) and differ where the indexer cache is
//! concerned: `deepseek32` gives every layer an indexer key (`filter_lid = il < n_layer()`), while
//! `glm-dsa` reads `attention.indexer.types` and gives one only to the "full" indexer layers
//! (`is_indexer_full`), the others reusing the previous full layer's top-k. So `glm-dsa` is the
//! one with both layer kinds the class distinguishes (layer 0 full, layer 1 shared), `deepseek32`
//! the one 0.1.147 selects the class for. Both load on 0.1.147-0.1.156 but their contexts abort
//! there: those pins' graphs offset the indexer's no-rope view by its own width, right only when
//! `N_ROT` is half of `INDEXER_KEY`
//! (`corpora/crash_dsa_indexer_nope_view_aborts_context_creation.json`), so the class runs on
//! these models from 0.1.157.
//!
//! Shapes are the smallest the code allows: MLA with `q_lora_rank` = `kv_lora_rank` = 8, a rope
//! part of 4 and a no-rope part of 4 per head (`key_length_mla` = `value_length_mla` = 8; the
//! cached K row is `kv_lora_rank + n_rot` = 12 wide, one KV head, no V: `llama_kv_cache` keeps
//! no V tensor when `hparams.is_mla()`, src/llama-kv-cache.cpp:231). The indexer key is 64 wide,
//! the one width that works: `llama_kv_cache` always rotates the indexer keys of these
//! architectures with a Hadamard matrix of `n_rot_k` >= 64 rows (src/llama-kv-cache.cpp:327-343,
//! `attn_rot_hadamard` from 64 up), which the graph applies to the key (`self_k_rot_lid`).
//! Every layer is a dense-lead layer (`leading_dense_block_count` = `block_count`), so no expert
//! tensors are written: experts change nothing the cache keeps.
//!
//! `indexer.top_k` is 4, so a query attends only the 4 cells the indexer scores highest once the
//! cache holds more (`build_attn` with `top_k`, src/llama-graph.cpp:3153-3176).
//!
//! `dots3note` (`llama_kv_cache_dsa_iswa`; 0.1.157 on, `create_memory` `llama-model.cpp:2543-2595`
//! in 0.1.161, src/models/dots3note.cpp the same in both pins) reads the same MLA tensors plus a
//! head-wise output gate (`attn_gate`, `{n_embd, n_head}`) and a norm of the shared rope key
//! (`attn_k_norm`, `{n_rot}`), and splits its layers by `attention.sliding_window_pattern`: the
//! full-attention ones carry the indexer (`attention.indexer.types`; the graph runs it on
//! `!is_swa` layers, so the two arrays are complements) and live in the DSA part, the
//! sliding-window ones in a windowed K-only cache. Here layer 0 is full, layer 1 windowed (window
//! [`Arch::swa_window`]); the windowed layers' MLA geometry (`*_swa` keys, required) is the full
//! layers', so both caches' K rows are `kv_lora_rank + n_rot` wide.

use super::memory_types::{common_keys, constant, uniform};
use super::TinyModelSpec;
use crate::base::op::Arch;
use crate::model::gguf::{GgufValue, GgufValueType, GgufWriter};

/// `attention.q_lora_rank`.
pub const Q_LORA_RANK: u32 = 8;
/// `attention.kv_lora_rank`: the compressed KV width, the cached K row's first part.
pub const KV_LORA_RANK: u32 = 8;
/// `rope.dimension_count`: the rope part of a query/key head (the cached K row's last part).
pub const N_ROT: u32 = 4;
/// The no-rope part of a query head (`key_length_mla - n_rot`).
pub const QK_NOPE: u32 = 4;
/// `attention.value_length_mla`: a head's value width after `attn_v_b`.
pub const V_HEAD: u32 = 8;
/// `attention.indexer.head_count`.
pub const INDEXER_HEADS: u32 = 1;
/// `attention.indexer.key_length`: 64, the smallest Hadamard rotation llama.cpp builds.
pub const INDEXER_KEY: u32 = 64;
/// `attention.indexer.top_k`: cells each query attends once the cache holds more.
pub const TOP_K: u32 = 4;
/// `expert_gating_func`: `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID` (as the released models; read
/// though no layer has experts).
const GATING_SIGMOID: u32 = 2;

/// Whether layer `l` of a `glm-dsa` model is a "full" indexer layer (has an indexer and a row in
/// the indexer key cache): layer 0 only, so a two-layer model has one of each kind. Every
/// `deepseek32` layer is. A `dots3note` model's full layers are its non-windowed ones: layer 0.
pub fn is_indexer_full(arch: Arch, l: u32) -> bool {
    !matches!(arch, Arch::GlmDsa | Arch::Dots3note) || l == 0
}

/// Whether layer `l` of a `dots3note` model is a sliding-window one (the others' layers never
/// are).
pub fn is_swa(arch: Arch, l: u32) -> bool {
    arch == Arch::Dots3note && !is_indexer_full(arch, l)
}

/// The writer for a `glm-dsa` or `deepseek32` spec (the caller validated it).
pub(super) fn writer(s: &TinyModelSpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    common_keys(&mut w, s);
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
        .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
        // MLA with absorption is MQA: one KV head (as convert_hf_to_gguf.py writes deepseek2).
        .add_kv(k("attention.head_count_kv"), GgufValue::U32(1))
        .add_kv(
            k("attention.key_length"),
            GgufValue::U32(KV_LORA_RANK + N_ROT),
        )
        .add_kv(k("attention.value_length"), GgufValue::U32(KV_LORA_RANK))
        .add_kv(
            k("attention.key_length_mla"),
            GgufValue::U32(QK_NOPE + N_ROT),
        )
        .add_kv(k("attention.value_length_mla"), GgufValue::U32(V_HEAD))
        .add_kv(k("attention.q_lora_rank"), GgufValue::U32(Q_LORA_RANK))
        .add_kv(k("attention.kv_lora_rank"), GgufValue::U32(KV_LORA_RANK))
        .add_kv(k("rope.dimension_count"), GgufValue::U32(N_ROT))
        .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
        .add_kv(k("leading_dense_block_count"), GgufValue::U32(s.n_layer))
        // 0.1.147's deepseek32 requires the expert counts; 0 experts is what a dense model has.
        .add_kv(k("expert_count"), GgufValue::U32(0))
        .add_kv(k("expert_used_count"), GgufValue::U32(0))
        .add_kv(k("expert_shared_count"), GgufValue::U32(0))
        .add_kv(k("expert_feed_forward_length"), GgufValue::U32(s.n_ff))
        .add_kv(k("expert_gating_func"), GgufValue::U32(GATING_SIGMOID))
        .add_kv(
            k("attention.indexer.head_count"),
            GgufValue::U32(INDEXER_HEADS),
        )
        .add_kv(
            k("attention.indexer.key_length"),
            GgufValue::U32(INDEXER_KEY),
        )
        .add_kv(k("attention.indexer.top_k"), GgufValue::U32(TOP_K));
    let per_layer = |f: &dyn Fn(u32) -> bool| {
        let v = (0..s.n_layer).map(|l| GgufValue::U32(u32::from(f(l))));
        GgufValue::Array(GgufValueType::U32, v.collect())
    };
    if matches!(s.arch, Arch::GlmDsa | Arch::Dots3note) {
        w.add_kv(
            k("attention.indexer.types"),
            per_layer(&|l| is_indexer_full(s.arch, l)),
        );
    }
    if s.arch == Arch::Dots3note {
        let window = s.sliding_window.unwrap_or(1);
        w.add_kv(
            k("attention.kv_lora_rank_swa"),
            GgufValue::U32(KV_LORA_RANK),
        )
        .add_kv(
            k("attention.key_length_mla_swa"),
            GgufValue::U32(QK_NOPE + N_ROT),
        )
        .add_kv(k("attention.value_length_mla_swa"), GgufValue::U32(V_HEAD))
        .add_kv(k("attention.sliding_window"), GgufValue::U32(window))
        .add_kv(k("rope.freq_base_swa"), GgufValue::F32(s.rope_freq_base))
        .add_kv(
            k("attention.sliding_window_pattern"),
            per_layer(&|l| is_swa(s.arch, l)),
        );
    }
    let (embd, vocab, ff) = (u64::from(s.n_embd), u64::from(s.n_vocab), u64::from(s.n_ff));
    let n_head = u64::from(s.n_head);
    let (q_lora, kv_lora) = (u64::from(Q_LORA_RANK), u64::from(KV_LORA_RANK));
    let (rot, nope, v_head) = (u64::from(N_ROT), u64::from(QK_NOPE), u64::from(V_HEAD));
    let (idx_heads, idx_key) = (u64::from(INDEXER_HEADS), u64::from(INDEXER_KEY));
    uniform(&mut w, s, "token_embd.weight".into(), &[embd, vocab], 1);
    constant(&mut w, "output_norm.weight".into(), &[embd], 1.0);
    uniform(&mut w, s, "output.weight".into(), &[embd, vocab], embd);
    for l in 0..s.n_layer {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        constant(&mut w, name("attn_norm"), &[embd], 1.0);
        constant(&mut w, name("attn_q_a_norm"), &[q_lora], 1.0);
        constant(&mut w, name("attn_kv_a_norm"), &[kv_lora], 1.0);
        uniform(&mut w, s, name("attn_q_a"), &[embd, q_lora], embd);
        uniform(
            &mut w,
            s,
            name("attn_q_b"),
            &[q_lora, n_head * (nope + rot)],
            q_lora,
        );
        uniform(
            &mut w,
            s,
            name("attn_kv_a_mqa"),
            &[embd, kv_lora + rot],
            embd,
        );
        uniform(&mut w, s, name("attn_k_b"), &[nope, kv_lora, n_head], nope);
        uniform(
            &mut w,
            s,
            name("attn_v_b"),
            &[kv_lora, v_head, n_head],
            kv_lora,
        );
        uniform(
            &mut w,
            s,
            name("attn_output"),
            &[n_head * v_head, embd],
            n_head * v_head,
        );
        if s.arch == Arch::Dots3note {
            constant(&mut w, name("attn_k_norm"), &[rot], 1.0);
            uniform(&mut w, s, name("attn_gate"), &[embd, n_head], embd);
        }
        constant(&mut w, name("ffn_norm"), &[embd], 1.0);
        uniform(&mut w, s, name("ffn_gate"), &[embd, ff], embd);
        uniform(&mut w, s, name("ffn_down"), &[ff, embd], ff);
        uniform(&mut w, s, name("ffn_up"), &[embd, ff], embd);
        if !is_indexer_full(s.arch, l) {
            // A shared indexer layer: its indexer tensors are TENSOR_NOT_REQUIRED (glm-dsa.cpp);
            // a windowed dots3note layer has none (dots3note.cpp, `is_indexer_full`).
            continue;
        }
        constant(&mut w, name("indexer.k_norm"), &[idx_key], 1.0);
        constant(
            &mut w,
            format!("blk.{l}.indexer.k_norm.bias"),
            &[idx_key],
            0.0,
        );
        uniform(&mut w, s, name("indexer.proj"), &[embd, idx_heads], embd);
        uniform(&mut w, s, name("indexer.attn_k"), &[embd, idx_key], embd);
        uniform(
            &mut w,
            s,
            name("indexer.attn_q_b"),
            &[q_lora, idx_heads * idx_key],
            q_lora,
        );
    }
    w
}
