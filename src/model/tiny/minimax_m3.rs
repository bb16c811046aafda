//! The tiny `minimax-m3` model: the architecture that gives llama.cpp's `llama_kv_cache_msa`
//! (0.1.161, `create_memory`, `src/llama-model.cpp:2382`): an attention K/V cache of every layer
//! beside an indexer key cache of the sparse (MSA) layers, `filter_idx = il >=
//! n_layer_dense_lead`.
//!
//! Keys and shapes are the ones `src/models/minimax-m3.cpp` (`load_arch_hparams`,
//! `load_arch_tensors`) asks for in 0.1.161: per-head Q/K norms on every layer; a dense
//! feed-forward block on the `leading_dense_block_count` lead layers; routed experts with a
//! probability bias, a shared expert and the indexer (`indexer.{q,k}_proj`, `indexer.{q,k}_norm`)
//! on the others. The graph asserts one indexer head per KV head (`HKV == Hd`) and ropes the
//! indexer with the attention's `n_rot`, so the indexer key is as wide as an attention head.
//!
//! Block selection (top `top_k` blocks of `block_size` positions, the last `local_blocks` forced)
//! runs only with flash attention on and per-sequence streams (`msa_enabled`,
//! `minimax-m3.cpp`); otherwise the sparse layers attend densely and write no indexer key.

use super::memory_types::{common_keys, constant, uniform};
use super::TinyModelSpec;
use crate::model::gguf::{GgufValue, GgufWriter};

/// `leading_dense_block_count`: one dense layer before the sparse ones.
pub const DENSE_LEAD: u32 = 1;
/// `expert_count` of the sparse layers (the loader asserts `expert_used_count <= expert_count`).
pub const N_EXPERT: u32 = 2;
/// `expert_used_count`.
pub const N_EXPERT_USED: u32 = 1;
/// `expert_feed_forward_length`.
pub const N_FF_EXP: u32 = 8;
/// `attention.indexer.block_size`: positions per MSA block.
pub const BLOCK_SIZE: u32 = 4;
/// `attention.indexer.top_k`: blocks each query attends (the local ones included).
pub const TOP_K: u32 = 2;
/// `attention.indexer.local_blocks`: the query's own block, always selected.
pub const LOCAL_BLOCKS: u32 = 1;
/// `expert_gating_func`: `LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID` (as the released model).
const GATING_SIGMOID: u32 = 2;

/// The writer for a `minimax-m3` spec (the caller validated it).
pub(super) fn writer(s: &TinyModelSpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    common_keys(&mut w, s);
    let arch = s.arch.name();
    let k = |key: &str| format!("{arch}.{key}");
    let hd = s.head_dim();
    w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
        .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
        .add_kv(k("attention.head_count_kv"), GgufValue::U32(s.n_head_kv))
        .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
        .add_kv(k("leading_dense_block_count"), GgufValue::U32(DENSE_LEAD))
        .add_kv(k("expert_count"), GgufValue::U32(N_EXPERT))
        .add_kv(k("expert_used_count"), GgufValue::U32(N_EXPERT_USED))
        .add_kv(k("expert_shared_count"), GgufValue::U32(1))
        .add_kv(k("expert_feed_forward_length"), GgufValue::U32(N_FF_EXP))
        .add_kv(k("expert_weights_scale"), GgufValue::F32(1.0))
        .add_kv(k("expert_weights_norm"), GgufValue::Bool(true))
        .add_kv(k("expert_gating_func"), GgufValue::U32(GATING_SIGMOID))
        .add_kv(
            k("attention.indexer.head_count"),
            GgufValue::U32(s.n_head_kv),
        )
        .add_kv(k("attention.indexer.key_length"), GgufValue::U32(hd))
        .add_kv(k("attention.indexer.top_k"), GgufValue::U32(TOP_K))
        .add_kv(
            k("attention.indexer.block_size"),
            GgufValue::U32(BLOCK_SIZE),
        )
        .add_kv(
            k("attention.indexer.local_blocks"),
            GgufValue::U32(LOCAL_BLOCKS),
        );
    let (embd, vocab, ff) = (u64::from(s.n_embd), u64::from(s.n_vocab), u64::from(s.n_ff));
    let (hd, ff_exp, n_exp) = (u64::from(hd), u64::from(N_FF_EXP), u64::from(N_EXPERT));
    let q_out = u64::from(s.n_head) * hd;
    let kv_out = u64::from(s.n_head_kv) * hd;
    uniform(&mut w, s, "token_embd.weight".into(), &[embd, vocab], 1);
    constant(&mut w, "output_norm.weight".into(), &[embd], 1.0);
    uniform(&mut w, s, "output.weight".into(), &[embd, vocab], embd);
    for l in 0..s.n_layer {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        uniform(&mut w, s, name("attn_q"), &[embd, q_out], embd);
        uniform(&mut w, s, name("attn_k"), &[embd, kv_out], embd);
        uniform(&mut w, s, name("attn_v"), &[embd, kv_out], embd);
        uniform(&mut w, s, name("attn_output"), &[q_out, embd], q_out);
        constant(&mut w, name("attn_norm"), &[embd], 1.0);
        constant(&mut w, name("attn_q_norm"), &[hd], 1.0);
        constant(&mut w, name("attn_k_norm"), &[hd], 1.0);
        constant(&mut w, name("ffn_norm"), &[embd], 1.0);
        if l < DENSE_LEAD {
            uniform(&mut w, s, name("ffn_gate"), &[embd, ff], embd);
            uniform(&mut w, s, name("ffn_down"), &[ff, embd], ff);
            uniform(&mut w, s, name("ffn_up"), &[embd, ff], embd);
            continue;
        }
        uniform(&mut w, s, name("ffn_gate_inp"), &[embd, n_exp], embd);
        constant(&mut w, format!("blk.{l}.exp_probs_b.bias"), &[n_exp], 0.0);
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
        let idx_q = u64::from(s.n_head_kv) * hd;
        uniform(&mut w, s, name("indexer.q_proj"), &[embd, idx_q], embd);
        uniform(&mut w, s, name("indexer.k_proj"), &[embd, hd], embd);
        constant(&mut w, name("indexer.q_norm"), &[hd], 1.0);
        constant(&mut w, name("indexer.k_norm"), &[hd], 1.0);
    }
    w
}
