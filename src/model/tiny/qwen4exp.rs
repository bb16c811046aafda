//! The tiny `qwen4exp` model: the architecture that gives llama.cpp's `llama_memory_hybrid_idx`
//! (0.1.161, `create_memory`, `src/llama-model.cpp:2694-2730`): a qwen3next-like hybrid whose
//! gated-delta-net (linear attention) layers are recurrent and whose dense-attention layers carry
//! a QSA indexer, so the memory is an attention cache, a recurrent memory and an indexer key cache
//! of the attention layers (`filter_idx = !is_recr(il)` once `indexer_head_size > 0`).
//!
//! Chosen over `glm5-next` (the other architecture with this memory) because it has fewer tensor
//! kinds (`load_arch_tensors` in `src/models/qwen4exp.cpp` asks for ~30, glm5-next's ~45 with MLA,
//! KDA and mHC) and because glm5-next's NextN graph is not implemented (`build_arch_graph`,
//! `src/models/glm5-next.cpp`), which the MTP context needs.
//!
//! Keys and shapes are the ones `src/models/qwen4exp.cpp` (`load_arch_hparams` :26-168,
//! `load_arch_tensors` :171-297) asks for in 0.1.161: hyper-connections (`hyper_connection.count`
//! > 1, `low_rank`) around every token mixer and feed-forward block and as the output norm;
//! every `full_attention_interval`-th layer dense attention with a Q gate, per-head Q/K norms and
//! the indexer (`indexer.{q,k}_proj`, `indexer.{q,k}_norm`), the others gated delta nets; routed
//! experts with a shared expert on every layer; IMRoPE (`rope.dimension_sections`). The
//! attention layer's `attention.compress_ratios` entry turns QSA on (`indexer_kpool`): the
//! indexer caches each token's raw key beside the pooled key of its block of [`KPOOL`] cells
//! (`indexer_kpool_row = 2`), and the query attends the top `top_k / kpool` blocks plus its tail.
//! No MTP block. `qwen4exp` has no PLE (`ple.layers` absent); `qwen4exp_ple` adds one on the
//! gated-delta-net layer 0 ([`ple_keys`], [`ple_tensors`]): an n-gram hash embedding whose rows
//! each token gathers from the [`PLE_NGRAM`]` - 1` tokens before it, which llama.cpp reads back
//! from the attention cache's cells (`get_prev_tokens`, src/llama-kv-cache.cpp:1847-1908), and a
//! depthwise conv whose history is a second recurrent row of that layer (`cache_ple_r_l`,
//! written after its R rows, src/llama-memory-recurrent.cpp:944-952).

use super::memory_types::{common_keys, constant, uniform};
use super::TinyModelSpec;
use crate::base::op::Arch;
use crate::model::gguf::{GgufValue, GgufValueType, GgufWriter};

/// `full_attention_interval`: layer 1 of 2 is the dense-attention (and indexer) layer, layer 0
/// the gated delta net (`is_recr_impl[i] = (i + 1) % interval != 0`, qwen4exp.cpp:150-155).
pub const FULL_ATTENTION_INTERVAL: u32 = 2;
/// `attention.compress_ratios` of the attention layer: QSA's block of pooled cells (> 1).
pub const KPOOL: u32 = 2;
/// `attention.indexer.top_k`: cells each query attends through its selected blocks (a multiple
/// of [`KPOOL`]).
pub const TOP_K: u32 = 4;
/// `hyper_connection.count`: residual streams (the loader refuses 1).
pub const HC: u32 = 2;
/// `hyper_connection.low_rank`.
pub const HC_LOW_RANK: u32 = 2;
/// `ssm.conv_kernel` of the gated delta net.
pub const SSM_CONV_KERNEL: u32 = 4;
/// `ssm.state_size`: the key and value head dimension of the gated delta net.
pub const SSM_STATE_SIZE: u32 = 4;
/// `ssm.group_count`: key heads of the gated delta net.
pub const SSM_GROUPS: u32 = 1;
/// `ssm.time_step_rank`: value heads of the gated delta net.
pub const SSM_V_HEADS: u32 = 2;
/// `expert_count` (the loader asserts `expert_used_count <= expert_count`).
pub const N_EXPERT: u32 = 2;
/// `expert_used_count`.
pub const N_EXPERT_USED: u32 = 1;
/// `expert_feed_forward_length` and `expert_shared_feed_forward_length`.
pub const N_FF_EXP: u32 = 8;

/// `ple.ngram_size` of `qwen4exp_ple`: each token's n-gram is itself and the token before it
/// (2, the smallest the loader takes, qwen4exp.cpp:118).
pub const PLE_NGRAM: u32 = 2;
/// `ple.heads_per_ngram`: `ple_n_heads = (ngram - 1) * heads_per_ngram` rows gathered per token.
pub const PLE_HEADS_PER_NGRAM: u32 = 2;
/// `ple.conv_kernel` (non-zero, qwen4exp.cpp:113).
pub const PLE_CONV_KERNEL: u32 = 2;
/// Rows of each PLE head's range of `per_layer_token_embd` (`ple.head_vocab_sizes`).
pub const PLE_HEAD_VOCAB: u64 = 8;
/// The layer that carries the PLE module: it must be a gated delta net (qwen4exp.cpp:158-162).
pub const PLE_LAYER: u32 = 0;

/// Whether layer `l` is a gated-delta-net (recurrent) layer.
pub fn is_recurrent_layer(l: u32) -> bool {
    (l + 1) % FULL_ATTENTION_INTERVAL != 0
}

/// The writer for a `qwen4exp` spec (the caller validated it).
pub(super) fn writer(s: &TinyModelSpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    common_keys(&mut w, s);
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    let hd = s.head_dim();
    // IMRoPE: the sections split n_rot / 2 rotary pairs (text positions use the first).
    let sections = [hd / 4, hd / 8, hd / 8, 0].map(GgufValue::U32).to_vec();
    let ratios = (0..s.n_layer)
        .map(|l| GgufValue::U32(if is_recurrent_layer(l) { 0 } else { KPOOL }))
        .collect();
    let ssm_inner = SSM_STATE_SIZE * SSM_V_HEADS;
    w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
        .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
        .add_kv(k("attention.head_count_kv"), GgufValue::U32(s.n_head_kv))
        .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
        .add_kv(
            k("rope.dimension_sections"),
            GgufValue::Array(GgufValueType::U32, sections),
        )
        .add_kv(
            k("full_attention_interval"),
            GgufValue::U32(FULL_ATTENTION_INTERVAL),
        )
        .add_kv(k("ssm.conv_kernel"), GgufValue::U32(SSM_CONV_KERNEL))
        .add_kv(k("ssm.inner_size"), GgufValue::U32(ssm_inner))
        .add_kv(k("ssm.state_size"), GgufValue::U32(SSM_STATE_SIZE))
        .add_kv(k("ssm.time_step_rank"), GgufValue::U32(SSM_V_HEADS))
        .add_kv(k("ssm.group_count"), GgufValue::U32(SSM_GROUPS))
        .add_kv(k("hyper_connection.count"), GgufValue::U32(HC))
        .add_kv(k("hyper_connection.low_rank"), GgufValue::U32(HC_LOW_RANK))
        .add_kv(k("attention.indexer.head_count"), GgufValue::U32(1))
        .add_kv(k("attention.indexer.key_length"), GgufValue::U32(hd))
        .add_kv(k("attention.indexer.top_k"), GgufValue::U32(TOP_K))
        .add_kv(
            k("attention.compress_ratios"),
            GgufValue::Array(GgufValueType::U32, ratios),
        )
        .add_kv(k("expert_count"), GgufValue::U32(N_EXPERT))
        .add_kv(k("expert_used_count"), GgufValue::U32(N_EXPERT_USED))
        .add_kv(k("expert_feed_forward_length"), GgufValue::U32(N_FF_EXP))
        .add_kv(
            k("expert_shared_feed_forward_length"),
            GgufValue::U32(N_FF_EXP),
        );
    if s.arch == Arch::Qwen4expPle {
        ple_keys(&mut w, s);
    }
    let (embd, vocab) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    let (hc, hc_lr) = (u64::from(HC), u64::from(HC_LOW_RANK));
    let hc_dim = hc * embd;
    let (hd, ff_exp, n_exp) = (u64::from(hd), u64::from(N_FF_EXP), u64::from(N_EXPERT));
    let q_out = u64::from(s.n_head) * hd;
    let kv_out = u64::from(s.n_head_kv) * hd;
    let key_dim = u64::from(SSM_STATE_SIZE * SSM_GROUPS);
    let value_dim = u64::from(ssm_inner);
    let conv_dim = 2 * key_dim + value_dim;
    uniform(&mut w, s, "token_embd.weight".into(), &[embd, vocab], 1);
    uniform(&mut w, s, "output.weight".into(), &[embd, vocab], embd);
    // The final hyper-connection mixer is the output norm.
    constant(&mut w, "output_hc_norm.weight".into(), &[embd, hc], 1.0);
    uniform(
        &mut w,
        s,
        "output_hc_down.weight".into(),
        &[hc_dim, hc_lr],
        hc_dim,
    );
    uniform(
        &mut w,
        s,
        "output_hc_up.weight".into(),
        &[hc_lr, hc_dim],
        hc_lr,
    );
    if s.arch == Arch::Qwen4expPle {
        ple_tensors(&mut w, s);
    }
    for l in 0..s.n_layer {
        let name = |t: &str| format!("blk.{l}.{t}.weight");
        for part in ["attn", "ffn"] {
            constant(&mut w, name(&format!("hc_{part}_norm")), &[embd, hc], 1.0);
            let down = name(&format!("hc_{part}_down"));
            uniform(&mut w, s, down, &[hc_dim, hc_lr], hc_dim);
            let up = name(&format!("hc_{part}_up"));
            uniform(&mut w, s, up, &[hc_lr, hc_dim], hc_lr);
            let inject = name(&format!("hc_{part}_inject"));
            uniform(&mut w, s, inject, &[hc_dim, hc], hc_dim);
        }
        if is_recurrent_layer(l) {
            let qkv = 2 * key_dim + value_dim;
            let v_heads = u64::from(SSM_V_HEADS);
            uniform(&mut w, s, name("attn_qkv"), &[embd, qkv], embd);
            uniform(&mut w, s, name("attn_gate"), &[embd, value_dim], embd);
            let conv = u64::from(SSM_CONV_KERNEL);
            uniform(&mut w, s, name("ssm_conv1d"), &[conv, conv_dim], conv);
            constant(&mut w, format!("blk.{l}.ssm_dt.bias"), &[v_heads], 0.0);
            // A = -exp(a) < 0: a decaying state.
            constant(&mut w, format!("blk.{l}.ssm_a"), &[v_heads], -1.0);
            uniform(&mut w, s, name("ssm_beta"), &[embd, v_heads], embd);
            uniform(&mut w, s, name("ssm_alpha"), &[embd, v_heads], embd);
            let state = u64::from(SSM_STATE_SIZE);
            constant(&mut w, name("ssm_norm"), &[state], 1.0);
            uniform(&mut w, s, name("ssm_out"), &[value_dim, embd], value_dim);
        } else {
            // wq holds [q | gate] per head.
            uniform(&mut w, s, name("attn_q"), &[embd, 2 * q_out], embd);
            uniform(&mut w, s, name("attn_k"), &[embd, kv_out], embd);
            uniform(&mut w, s, name("attn_v"), &[embd, kv_out], embd);
            uniform(&mut w, s, name("attn_output"), &[q_out, embd], q_out);
            constant(&mut w, name("attn_q_norm"), &[hd], 1.0);
            constant(&mut w, name("attn_k_norm"), &[hd], 1.0);
            uniform(&mut w, s, name("indexer.q_proj"), &[embd, hd], embd);
            uniform(&mut w, s, name("indexer.k_proj"), &[embd, hd], embd);
            constant(&mut w, name("indexer.q_norm"), &[hd], 1.0);
            constant(&mut w, name("indexer.k_norm"), &[hd], 1.0);
        }
        uniform(&mut w, s, name("ffn_gate_inp"), &[embd, n_exp], embd);
        let exps = [embd, ff_exp, n_exp];
        uniform(&mut w, s, name("ffn_gate_exps"), &exps, embd);
        uniform(&mut w, s, name("ffn_up_exps"), &exps, embd);
        uniform(
            &mut w,
            s,
            name("ffn_down_exps"),
            &[ff_exp, embd, n_exp],
            ff_exp,
        );
        uniform(&mut w, s, name("ffn_gate_inp_shexp"), &[embd], embd);
        uniform(&mut w, s, name("ffn_gate_shexp"), &[embd, ff_exp], embd);
        uniform(&mut w, s, name("ffn_up_shexp"), &[embd, ff_exp], embd);
        uniform(&mut w, s, name("ffn_down_shexp"), &[ff_exp, embd], ff_exp);
    }
    w
}

/// The PLE heads: `(ngram - 1) * heads_per_ngram`.
fn ple_heads() -> u32 {
    (PLE_NGRAM - 1) * PLE_HEADS_PER_NGRAM
}

/// The `ple.*` keys of `qwen4exp_ple` (`load_arch_hparams`, qwen4exp.cpp:85-146): one PLE layer,
/// head ranges laid end to end in the table, each head's embedding `n_embd / heads` wide so that
/// the gathered rows make one `n_embd` vector per token (`build_inp_ple`, :1353-1370).
fn ple_keys(w: &mut GgufWriter, s: &TinyModelSpec) {
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    let heads = ple_heads();
    let u64s = |v: Vec<u64>| {
        GgufValue::Array(
            GgufValueType::U64,
            v.into_iter().map(GgufValue::U64).collect(),
        )
    };
    w.add_kv(
        k("ple.layers"),
        GgufValue::Array(GgufValueType::U32, vec![GgufValue::U32(PLE_LAYER)]),
    )
    .add_kv(k("ple.ngram_size"), GgufValue::U32(PLE_NGRAM))
    .add_kv(
        k("ple.heads_per_ngram"),
        GgufValue::U32(PLE_HEADS_PER_NGRAM),
    )
    .add_kv(k("ple.conv_kernel"), GgufValue::U32(PLE_CONV_KERNEL))
    .add_kv(k("ple.eos_token_id"), GgufValue::U32(0))
    .add_kv(
        k("embedding_length_per_layer_input"),
        GgufValue::U32(s.n_embd / heads),
    )
    // Odd multipliers, as a hash's are; any fixed values make the model deterministic.
    .add_kv(
        k("ple.layer_multipliers"),
        u64s((0..PLE_NGRAM).map(|j| 2 * u64::from(j) + 3).collect()),
    )
    .add_kv(
        k("ple.head_offsets"),
        u64s((0..heads).map(|h| u64::from(h) * PLE_HEAD_VOCAB).collect()),
    )
    .add_kv(
        k("ple.head_vocab_sizes"),
        u64s(vec![PLE_HEAD_VOCAB; heads as usize]),
    );
}

/// The PLE tensors (`load_arch_tensors`, qwen4exp.cpp:196-216 and :267-274): the shared table
/// and the PLE layer's key, value, three grouped norms and conv kernel.
fn ple_tensors(w: &mut GgufWriter, s: &TinyModelSpec) {
    let embd = u64::from(s.n_embd);
    let heads = u64::from(ple_heads());
    let hc = u64::from(HC);
    let hc_dim = hc * embd;
    uniform(
        w,
        s,
        "per_layer_token_embd.weight".into(),
        &[embd / heads, heads * PLE_HEAD_VOCAB],
        1,
    );
    let name = |t: &str| format!("blk.{PLE_LAYER}.{t}.weight");
    uniform(w, s, name("ple_key"), &[embd, hc_dim], embd);
    uniform(w, s, name("ple_value"), &[embd, embd], embd);
    for norm in ["ple_norm_key", "ple_norm_query", "ple_norm_conv"] {
        constant(w, name(norm), &[embd, hc], 1.0);
    }
    let kern = u64::from(PLE_CONV_KERNEL);
    uniform(w, s, name("ple_conv1d"), &[kern, hc_dim], kern);
}
