//! The tiny `deepseek4` model: the architecture that gives llama.cpp's `llama_kv_cache_dsv4`
//! (0.1.161, `create_memory`, `src/llama-model.cpp:2594-2640`; it asserts `swa_type != NONE`,
//! which `load_arch_hparams` always sets): a raw K-only iSWA token cache of every layer beside
//! compressed K caches and compressor states per compression ratio
//! (`src/llama-kv-cache-dsv4.cpp:1213-1339`): ratio 4 (CSA, with the lightning indexer's cache
//! and state, LID) and ratio 128 (HCA).
//!
//! Keys and shapes are the ones `src/models/deepseek4.cpp` (`load_arch_hparams`,
//! `load_arch_tensors`) asks for in 0.1.161 and 0.1.154: MLA attention (a low-rank Q, one K=V head
//! of `key_length`, grouped low-rank output), the hyper-connection mixer (`hc_*`, the graph asserts
//! `hyper_connection.count == 4`), routed experts with a shared one (`expert_gating_func` must be
//! SQRT_SOFTPLUS, `hash_layer_count` 0 so every layer routes by `exp_probs_b`), and per layer by
//! its `attention.compress_ratios` entry: the compressor (`attn_compressor_*`, twice as wide at
//! ratio 4, whose blocks overlap) and at ratio 4 the indexer (`indexer.*`, `indexer_compressor_*`).
//! Two blocks, one per compressed kind ([`COMPRESS_RATIOS`]); every dimension the smallest the
//! asserts allow with a RoPE part and a non-RoPE part of each head.

use super::memory_types::{common_keys, constant, uniform};
use super::TinyModelSpec;
use crate::model::gguf::{GgufValue, GgufValueType, GgufWriter};

/// `attention.compress_ratios` of the two blocks: the CSA ratio (4, with the indexer) and the HCA
/// ratio (128) the loader accepts besides 0 (`load_arch_tensors`); the cache's CSA, LID and HCA
/// parts each get one layer (`filter_csa`, `filter_hca`, `llama-kv-cache-dsv4.cpp:1275-1290`).
pub const COMPRESS_RATIOS: [u32; 2] = [4, 128];
/// `attention.key_length` (= `value_length`, asserted by the graph): the MLA head, K and V alike.
pub const HEAD_DIM: u32 = 8;
/// `rope.dimension_count`: the RoPE part of a head (the rest is not rotated, `rope_set_offset`);
/// the indexer's head ropes as many (`n_embd_indexer_head_rope = n_rot`).
pub const N_ROT: u32 = 4;
/// `attention.q_lora_rank`.
pub const Q_LORA_RANK: u32 = 8;
/// `attention.output_group_count` (must divide `head_count`).
pub const O_GROUPS: u32 = 1;
/// `attention.output_lora_rank`.
pub const O_LORA_RANK: u32 = 8;
/// `hyper_connection.count`: the graph asserts 4 (`build_hc_pre`).
pub const HC_MULT: u32 = 4;
/// `attention.indexer.head_count`.
pub const INDEXER_HEADS: u32 = 1;
/// `attention.indexer.key_length`: 64, the smallest that loads. The indexer's cache always gets
/// a Hadamard rotation of 64 x 64 (`n_embd_head_k_full == indexer_head_size` for DEEPSEEK4,
/// src/llama-kv-cache.cpp:326-331 in 0.1.161), which a narrower head cannot take (32 aborts
/// in the first decode); the attention head stays narrower than it, so the raw cache does not
/// rotate.
pub const INDEXER_HEAD_DIM: u32 = 64;
/// `attention.indexer.top_k`: compressed CSA rows a query attends.
pub const INDEXER_TOP_K: u32 = 2;
/// `expert_count`.
pub const N_EXPERT: u32 = 2;
/// `expert_used_count`.
pub const N_EXPERT_USED: u32 = 1;
/// `expert_feed_forward_length`.
pub const N_FF_EXP: u32 = 8;
/// `expert_gating_func`: `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS` (`src/llama-hparams.h`),
/// the only one the loader accepts.
const GATING_SQRT_SOFTPLUS: u32 = 4;

/// The writer for a `deepseek4` spec (the caller validated it).
pub(super) fn writer(s: &TinyModelSpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    common_keys(&mut w, s);
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    let per_layer_f32 = |v: f32| {
        GgufValue::Array(
            GgufValueType::F32,
            (0..s.n_layer).map(|_| GgufValue::F32(v)).collect(),
        )
    };
    let ratios = (0..s.n_layer)
        .map(|l| GgufValue::U32(compress_ratio(l)))
        .collect();
    w.add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
        .add_kv(k("attention.head_count_kv"), GgufValue::U32(1))
        .add_kv(k("attention.key_length"), GgufValue::U32(HEAD_DIM))
        .add_kv(k("attention.value_length"), GgufValue::U32(HEAD_DIM))
        .add_kv(k("rope.dimension_count"), GgufValue::U32(N_ROT))
        .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
        .add_kv(k("attention.q_lora_rank"), GgufValue::U32(Q_LORA_RANK))
        .add_kv(
            k("attention.sliding_window"),
            GgufValue::U32(s.sliding_window.unwrap_or(4)),
        )
        .add_kv(k("expert_count"), GgufValue::U32(N_EXPERT))
        .add_kv(k("expert_used_count"), GgufValue::U32(N_EXPERT_USED))
        .add_kv(k("expert_shared_count"), GgufValue::U32(1))
        .add_kv(k("expert_feed_forward_length"), GgufValue::U32(N_FF_EXP))
        .add_kv(k("expert_weights_scale"), GgufValue::F32(1.0))
        .add_kv(k("expert_weights_norm"), GgufValue::Bool(true))
        .add_kv(
            k("expert_gating_func"),
            GgufValue::U32(GATING_SQRT_SOFTPLUS),
        )
        .add_kv(k("swiglu_clamp_exp"), per_layer_f32(10.0))
        .add_kv(
            k("attention.indexer.head_count"),
            GgufValue::U32(INDEXER_HEADS),
        )
        .add_kv(
            k("attention.indexer.key_length"),
            GgufValue::U32(INDEXER_HEAD_DIM),
        )
        .add_kv(k("attention.indexer.top_k"), GgufValue::U32(INDEXER_TOP_K))
        .add_kv(k("attention.output_group_count"), GgufValue::U32(O_GROUPS))
        .add_kv(k("attention.output_lora_rank"), GgufValue::U32(O_LORA_RANK))
        .add_kv(
            k("attention.compress_rope_freq_base"),
            GgufValue::F32(s.rope_freq_base),
        )
        .add_kv(
            k("attention.compress_ratios"),
            GgufValue::Array(GgufValueType::U32, ratios),
        )
        .add_kv(k("hyper_connection.count"), GgufValue::U32(HC_MULT))
        .add_kv(k("hyper_connection.sinkhorn_iterations"), GgufValue::U32(2))
        .add_kv(k("hyper_connection.epsilon"), GgufValue::F32(1e-6))
        .add_kv(k("hash_layer_count"), GgufValue::U32(0));

    let (embd, vocab) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    let (hd, n_head) = (u64::from(HEAD_DIM), u64::from(s.n_head));
    let (q_rank, o_groups, o_rank) = (
        u64::from(Q_LORA_RANK),
        u64::from(O_GROUPS),
        u64::from(O_LORA_RANK),
    );
    let hc = u64::from(HC_MULT);
    let (hc_dim, hc_mix) = (hc * embd, (2 + hc) * hc);
    let (ff_exp, n_exp) = (u64::from(N_FF_EXP), u64::from(N_EXPERT));
    uniform(&mut w, s, "token_embd.weight".into(), &[embd, vocab], 1);
    constant(&mut w, "output_norm.weight".into(), &[embd], 1.0);
    uniform(&mut w, s, "output.weight".into(), &[embd, vocab], embd);
    uniform(
        &mut w,
        s,
        "output_hc_fn.weight".into(),
        &[hc_dim, hc],
        hc_dim,
    );
    constant(&mut w, "output_hc_base.weight".into(), &[hc], 0.0);
    constant(&mut w, "output_hc_scale.weight".into(), &[1], 1.0);
    for l in 0..s.n_layer {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        constant(&mut w, name("attn_norm"), &[embd], 1.0);
        constant(&mut w, name("attn_sinks"), &[n_head], 0.0);
        uniform(&mut w, s, name("attn_q_a"), &[embd, q_rank], embd);
        constant(&mut w, name("attn_q_a_norm"), &[q_rank], 1.0);
        uniform(&mut w, s, name("attn_q_b"), &[q_rank, n_head * hd], q_rank);
        uniform(&mut w, s, name("attn_kv"), &[embd, hd], embd);
        constant(&mut w, name("attn_kv_a_norm"), &[hd], 1.0);
        // The file's shape; the loader reshapes it to (n_head*hd/groups, o_rank, groups).
        let wo_a_in = n_head * hd / o_groups;
        uniform(
            &mut w,
            s,
            name("attn_output_a"),
            &[wo_a_in, o_rank * o_groups],
            wo_a_in,
        );
        uniform(
            &mut w,
            s,
            name("attn_output_b"),
            &[o_groups * o_rank, embd],
            o_groups * o_rank,
        );
        for part in ["attn", "ffn"] {
            uniform(
                &mut w,
                s,
                name(&format!("hc_{part}_fn")),
                &[hc_dim, hc_mix],
                hc_dim,
            );
            constant(&mut w, name(&format!("hc_{part}_base")), &[hc_mix], 0.0);
            constant(&mut w, name(&format!("hc_{part}_scale")), &[3], 1.0);
        }
        let ratio = u64::from(compress_ratio(l));
        if ratio != 0 {
            let coff = if ratio == 4 { 2 } else { 1 };
            uniform(
                &mut w,
                s,
                name("attn_compressor_kv"),
                &[embd, coff * hd],
                embd,
            );
            uniform(
                &mut w,
                s,
                name("attn_compressor_gate"),
                &[embd, coff * hd],
                embd,
            );
            uniform(
                &mut w,
                s,
                name("attn_compressor_ape"),
                &[coff * hd, ratio],
                1,
            );
            constant(&mut w, name("attn_compressor_norm"), &[hd], 1.0);
            if ratio == 4 {
                let (ih, id) = (u64::from(INDEXER_HEADS), u64::from(INDEXER_HEAD_DIM));
                uniform(&mut w, s, name("indexer.proj"), &[embd, ih], embd);
                uniform(
                    &mut w,
                    s,
                    name("indexer.attn_q_b"),
                    &[q_rank, ih * id],
                    q_rank,
                );
                uniform(
                    &mut w,
                    s,
                    name("indexer_compressor_kv"),
                    &[embd, 2 * id],
                    embd,
                );
                uniform(
                    &mut w,
                    s,
                    name("indexer_compressor_gate"),
                    &[embd, 2 * id],
                    embd,
                );
                uniform(
                    &mut w,
                    s,
                    name("indexer_compressor_ape"),
                    &[2 * id, ratio],
                    1,
                );
                constant(&mut w, name("indexer_compressor_norm"), &[id], 1.0);
            }
        }
        uniform(&mut w, s, name("ffn_gate_inp"), &[embd, n_exp], embd);
        constant(&mut w, format!("blk.{l}.exp_probs_b.bias"), &[n_exp], 0.0);
        constant(&mut w, name("ffn_norm"), &[embd], 1.0);
        uniform(
            &mut w,
            s,
            name("ffn_gate_exps"),
            &[embd, ff_exp, n_exp],
            embd,
        );
        uniform(
            &mut w,
            s,
            name("ffn_down_exps"),
            &[ff_exp, embd, n_exp],
            ff_exp,
        );
        uniform(&mut w, s, name("ffn_up_exps"), &[embd, ff_exp, n_exp], embd);
        uniform(&mut w, s, name("ffn_gate_shexp"), &[embd, ff_exp], embd);
        uniform(&mut w, s, name("ffn_down_shexp"), &[ff_exp, embd], ff_exp);
        uniform(&mut w, s, name("ffn_up_shexp"), &[embd, ff_exp], embd);
    }
    w
}

/// Block `l`'s compression ratio ([`COMPRESS_RATIOS`], cycled for a spec of more blocks).
pub fn compress_ratio(l: u32) -> u32 {
    COMPRESS_RATIOS[l as usize % COMPRESS_RATIOS.len()]
}
