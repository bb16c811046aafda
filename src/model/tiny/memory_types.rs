//! The tiny models of the architectures that give llama.cpp's other memory types: `gemma2`
//! (`llama_kv_cache_iswa`: a full cache beside a sliding-window one), `mamba`
//! (`llama_memory_recurrent`: one state per sequence), `jamba` (`llama_memory_hybrid`: recurrent
//! and attention layers) and `lfm2` (`llama_memory_hybrid` too, with short-convolution layers:
//! `src/models/lfm2.cpp`, the architecture whose recurrent states roll back, `n_rs_seq`); `lfm2_swa`
//! is lfm2 with `lfm2.attention.sliding_window`, which gives `llama_memory_hybrid_iswa`.
//!
//! Keys and tensor shapes are the ones llama.cpp's loaders ask for, identical in both pins:
//! `src/models/gemma2.cpp` (`load_arch_hparams`, `load_arch_tensors`), `src/models/mamba.cpp` and
//! `src/models/jamba.cpp`; the shared keys are read by `llama_model::load_hparams` in
//! `src/llama-model.cpp` (`get_key_or_arr` for `feed_forward_length`, `attention.head_count` and
//! `attention.head_count_kv`, so jamba's per-layer `head_count_kv` is an array). A tensor the
//! loader does not ask for fails the load ("wrong number of tensors"), so gemma2 has no
//! `output.weight` (its output is `token_embd.weight`, `TENSOR_DUPLICATED`).

use super::{uniform_weights, TinyModelSpec};
use crate::base::op::Arch;
use crate::model::gguf::{GgufValue, GgufValueType, GgufWriter};

/// `ssm.conv_kernel`: the width of mamba's causal convolution (4 in every released mamba).
pub const SSM_CONV_KERNEL: u32 = 4;
/// `ssm.state_size`: the recurrent state per channel.
pub const SSM_STATE_SIZE: u32 = 8;
/// `ssm.time_step_rank`: the rank of the time-step projection.
pub const SSM_TIME_STEP_RANK: u32 = 2;

/// `ssm.inner_size`: both loaders accept only an expansion factor of 2
/// (`load_arch_tensors` in `src/models/mamba.cpp` and `src/models/jamba.cpp`).
pub fn ssm_inner_size(spec: &TinyModelSpec) -> u32 {
    2 * spec.n_embd
}

/// `shortconv.l_cache`: the width of lfm2's short convolution (3 in the released LFM2 models);
/// its recurrent state is the last `l_cache - 1` inputs per channel (`n_embd_r`,
/// src/llama-hparams.cpp).
pub const SHORTCONV_L_CACHE: u32 = 3;

/// Whether layer `l` of a jamba model is an attention layer (the others are mamba layers):
/// odd layers, so a two-block model has one of each. llama.cpp marks a recurrent layer by a
/// `head_count_kv` of 0 (`is_recr_impl[i] = n_head_kv(i) == 0` in `src/models/jamba.cpp`).
pub fn jamba_is_attention_layer(l: u32) -> bool {
    l % 2 == 1
}

/// `attention.head_count_kv` per layer of a jamba or lfm2 model: 0 marks a recurrent layer
/// ([`jamba_is_attention_layer`] says which are not).
fn kv_heads_per_layer(s: &TinyModelSpec) -> Vec<GgufValue> {
    (0..s.n_layer)
        .map(|l| {
            GgufValue::U32(if jamba_is_attention_layer(l) {
                s.n_head_kv
            } else {
                0
            })
        })
        .collect()
}

/// The keys every architecture shares, under `arch.`, with strict types as llama.cpp checks them.
pub(super) fn common_keys(w: &mut GgufWriter, s: &TinyModelSpec) {
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    w.add_kv("general.architecture", GgufValue::String(arch.into()))
        .add_kv(
            "general.name",
            GgufValue::String(format!("kvaudit-tiny-{arch}")),
        )
        .add_kv(k("context_length"), GgufValue::U32(s.n_ctx_train))
        .add_kv(k("embedding_length"), GgufValue::U32(s.n_embd))
        .add_kv(k("block_count"), GgufValue::U32(s.n_layer))
        .add_kv(k("vocab_size"), GgufValue::U32(s.n_vocab))
        .add_kv(
            k("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(s.rms_eps),
        )
        .add_kv("tokenizer.ggml.model", GgufValue::String("none".into()));
}

/// The `ssm.*` keys mamba and jamba read.
fn ssm_keys(w: &mut GgufWriter, s: &TinyModelSpec) {
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.ssm.{key}");
    w.add_kv(k("conv_kernel"), GgufValue::U32(SSM_CONV_KERNEL))
        .add_kv(k("inner_size"), GgufValue::U32(ssm_inner_size(s)))
        .add_kv(k("state_size"), GgufValue::U32(SSM_STATE_SIZE))
        .add_kv(k("time_step_rank"), GgufValue::U32(SSM_TIME_STEP_RANK));
}

/// Adds `name` with `dims`, uniform weights of variance `1/fan_in`.
pub(super) fn uniform(
    w: &mut GgufWriter,
    s: &TinyModelSpec,
    name: String,
    dims: &[u64],
    fan_in: u64,
) {
    let n = dims.iter().product::<u64>() as usize;
    let data = uniform_weights(s.seed, &name, n, fan_in as u32);
    w.add_tensor_f32(name, dims, data);
}

/// Adds `name` with `dims`, every element `value` (norms: 1).
pub(super) fn constant(w: &mut GgufWriter, name: String, dims: &[u64], value: f32) {
    let n = dims.iter().product::<u64>() as usize;
    w.add_tensor_f32(name, dims, vec![value; n]);
}

/// Token embedding and output norm (every architecture), and `output.weight` unless tied.
fn embedding_and_output(w: &mut GgufWriter, s: &TinyModelSpec, tied: bool) {
    let (embd, vocab) = (u64::from(s.n_embd), u64::from(s.n_vocab));
    uniform(w, s, "token_embd.weight".into(), &[embd, vocab], 1);
    constant(w, "output_norm.weight".into(), &[embd], 1.0);
    if !tied {
        uniform(w, s, "output.weight".into(), &[embd, vocab], embd);
    }
}

/// One attention block's projections (`create_tensor_qkv` and `wo`) and its feed-forward block.
fn attention_and_ffn(w: &mut GgufWriter, s: &TinyModelSpec, l: u32, attention: bool) {
    let (embd, ff) = (u64::from(s.n_embd), u64::from(s.n_ff));
    let name = |t: &str| format!("blk.{l}.{t}.weight");
    if attention {
        let hd = u64::from(s.head_dim());
        let q_out = u64::from(s.n_head) * hd;
        let kv_out = u64::from(s.n_head_kv) * hd;
        uniform(w, s, name("attn_q"), &[embd, q_out], embd);
        uniform(w, s, name("attn_k"), &[embd, kv_out], embd);
        uniform(w, s, name("attn_v"), &[embd, kv_out], embd);
        uniform(w, s, name("attn_output"), &[q_out, embd], q_out);
    }
    uniform(w, s, name("ffn_gate"), &[embd, ff], embd);
    uniform(w, s, name("ffn_up"), &[embd, ff], embd);
    uniform(w, s, name("ffn_down"), &[ff, embd], ff);
    constant(w, name("ffn_norm"), &[embd], 1.0);
}

/// One mamba block's tensors (`src/models/mamba.cpp`; jamba adds three norms).
fn mamba_block(w: &mut GgufWriter, s: &TinyModelSpec, l: u32, jamba_norms: bool) {
    let embd = u64::from(s.n_embd);
    let inner = u64::from(ssm_inner_size(s));
    let (conv, state, rank) = (
        u64::from(SSM_CONV_KERNEL),
        u64::from(SSM_STATE_SIZE),
        u64::from(SSM_TIME_STEP_RANK),
    );
    let weight = |t: &str| format!("blk.{l}.{t}.weight");
    let bias = |t: &str| format!("blk.{l}.{t}.bias");
    uniform(w, s, weight("ssm_in"), &[embd, 2 * inner], embd);
    uniform(w, s, weight("ssm_conv1d"), &[conv, inner], conv);
    uniform(w, s, bias("ssm_conv1d"), &[inner], inner);
    uniform(w, s, weight("ssm_x"), &[inner, rank + 2 * state], inner);
    uniform(w, s, weight("ssm_dt"), &[rank, inner], rank);
    uniform(w, s, bias("ssm_dt"), &[inner], inner);
    if jamba_norms {
        constant(w, weight("ssm_dt_norm"), &[rank], 1.0);
        constant(w, weight("ssm_b_norm"), &[state], 1.0);
        constant(w, weight("ssm_c_norm"), &[state], 1.0);
    }
    // A = -exp(A_log) in a trained mamba: negative, so the state decays; -(1..=state) per channel
    // as the reference initialisation (S4D-real) does.
    let a: Vec<f32> = (0..inner)
        .flat_map(|_| (1..=state).map(|n| -(n as f32)))
        .collect();
    w.add_tensor_f32(format!("blk.{l}.ssm_a"), &[state, inner], a);
    constant(w, format!("blk.{l}.ssm_d"), &[inner], 1.0);
    uniform(w, s, weight("ssm_out"), &[inner, embd], inner);
}

/// The writer for a `gemma2`, `mamba` or `jamba` spec (the caller validated it).
pub(super) fn writer(s: &TinyModelSpec) -> GgufWriter {
    let mut w = GgufWriter::new();
    common_keys(&mut w, s);
    let arch = s.arch.gguf_name();
    let k = |key: &str| format!("{arch}.{key}");
    let embd = u64::from(s.n_embd);
    match s.arch {
        Arch::Llama
        | Arch::LlamaHd64
        | Arch::MinimaxM3
        | Arch::Qwen4exp
        | Arch::Qwen4expPle
        | Arch::Deepseek4
        | Arch::GlmDsa
        | Arch::Deepseek32
        | Arch::Dots3note => {
            unreachable!("the llama, minimax-m3, qwen4exp, deepseek4 and dsa writers are their own")
        }
        Arch::Gemma2 => {
            w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
                .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
                .add_kv(k("attention.head_count_kv"), GgufValue::U32(s.n_head_kv))
                .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
                .add_kv(
                    k("attention.sliding_window"),
                    GgufValue::U32(s.sliding_window.unwrap_or(GEMMA2_DEFAULT_WINDOW)),
                );
            embedding_and_output(&mut w, s, true);
            for l in 0..s.n_layer {
                constant(&mut w, format!("blk.{l}.attn_norm.weight"), &[embd], 1.0);
                attention_and_ffn(&mut w, s, l, true);
                constant(
                    &mut w,
                    format!("blk.{l}.post_attention_norm.weight"),
                    &[embd],
                    1.0,
                );
                constant(
                    &mut w,
                    format!("blk.{l}.post_ffw_norm.weight"),
                    &[embd],
                    1.0,
                );
            }
        }
        Arch::Mamba => {
            // No attention and no feed-forward block: llama.cpp reads these as 0 heads.
            w.add_kv(k("feed_forward_length"), GgufValue::U32(0))
                .add_kv(k("attention.head_count"), GgufValue::U32(0))
                .add_kv(k("attention.head_count_kv"), GgufValue::U32(0));
            ssm_keys(&mut w, s);
            embedding_and_output(&mut w, s, false);
            for l in 0..s.n_layer {
                constant(&mut w, format!("blk.{l}.attn_norm.weight"), &[embd], 1.0);
                mamba_block(&mut w, s, l, false);
            }
        }
        Arch::Jamba => {
            w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
                .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
                .add_kv(
                    k("attention.head_count_kv"),
                    GgufValue::Array(GgufValueType::U32, kv_heads_per_layer(s)),
                );
            ssm_keys(&mut w, s);
            embedding_and_output(&mut w, s, false);
            for l in 0..s.n_layer {
                constant(&mut w, format!("blk.{l}.attn_norm.weight"), &[embd], 1.0);
                if jamba_is_attention_layer(l) {
                    attention_and_ffn(&mut w, s, l, true);
                } else {
                    mamba_block(&mut w, s, l, true);
                    attention_and_ffn(&mut w, s, l, false);
                }
            }
        }
        Arch::Lfm2 | Arch::Lfm2Swa => {
            // src/models/lfm2.cpp: a layer with 0 KV heads is a short-convolution layer
            // (`is_recr_impl`); every layer has the feed-forward block and `attn_norm`, attention
            // layers add Q/K norms; the output norm is named `token_embd_norm`.
            w.add_kv(k("feed_forward_length"), GgufValue::U32(s.n_ff))
                .add_kv(k("attention.head_count"), GgufValue::U32(s.n_head))
                .add_kv(
                    k("attention.head_count_kv"),
                    GgufValue::Array(GgufValueType::U32, kv_heads_per_layer(s)),
                )
                .add_kv(k("rope.freq_base"), GgufValue::F32(s.rope_freq_base))
                .add_kv(k("shortconv.l_cache"), GgufValue::U32(SHORTCONV_L_CACHE));
            // The key makes every attention layer windowed and the memory hybrid-iSWA
            // (src/models/lfm2.cpp:26-31 in 0.1.161); lfm2 proper has none.
            if let Some(window) = s.sliding_window {
                w.add_kv(k("attention.sliding_window"), GgufValue::U32(window));
            }
            let vocab = u64::from(s.n_vocab);
            uniform(&mut w, s, "token_embd.weight".into(), &[embd, vocab], 1);
            constant(&mut w, "token_embd_norm.weight".into(), &[embd], 1.0);
            uniform(&mut w, s, "output.weight".into(), &[embd, vocab], embd);
            let hd = u64::from(s.head_dim());
            for l in 0..s.n_layer {
                let name = |t: &str| format!("blk.{l}.{t}.weight");
                constant(&mut w, name("attn_norm"), &[embd], 1.0);
                if jamba_is_attention_layer(l) {
                    constant(&mut w, name("attn_q_norm"), &[hd], 1.0);
                    constant(&mut w, name("attn_k_norm"), &[hd], 1.0);
                    attention_and_ffn(&mut w, s, l, true);
                } else {
                    let conv = u64::from(SHORTCONV_L_CACHE);
                    uniform(&mut w, s, name("shortconv.conv"), &[conv, embd], conv);
                    uniform(
                        &mut w,
                        s,
                        name("shortconv.in_proj"),
                        &[embd, 3 * embd],
                        embd,
                    );
                    uniform(&mut w, s, name("shortconv.out_proj"), &[embd, embd], embd);
                    attention_and_ffn(&mut w, s, l, false);
                }
            }
        }
    }
    w
}

/// gemma2's window when the spec gives none (`n_swa = 4096` in `src/models/gemma2.cpp`): only
/// used for a spec built by hand; [`TinyModelSpec::for_arch`] always sets one.
const GEMMA2_DEFAULT_WINDOW: u32 = 4096;
