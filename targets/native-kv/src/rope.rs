//! Rotary position embedding as llama.cpp applies it to arch `llama` (`LLAMA_ROPE_TYPE_NORM`):
//! adjacent pairs `(x[2i], x[2i+1])` of each head rotate by `theta_i = pos * base^(-2i/head_dim)`.
//!
//! This is the one implementation of RoPE in the workspace: the tensor payload of this cache
//! ([`crate::tensors`]) re-positions keys with it, and kvaudit's reference forward pass
//! (`src/model/rope.rs` re-exports it) rotates with it, so a key rotated at prefill and a key
//! re-rotated after `seq_add` come from the same code.
//!
//! The arithmetic follows ggml-cpu step by step (`ggml/src/ggml-cpu/ops.cpp` in llama-cpp-sys-2
//! 0.1.161): `theta_scale = powf(freq_base, -2.0f/n_dims)` (`ggml_compute_forward_rope_flt`),
//! `theta` starts at the position and is multiplied by `theta_scale` once per pair, in f32
//! (`ggml_rope_cache_init`), `cos`/`sin` are `cosf`/`sinf` of it (`rope_yarn`, with
//! `freq_scale = 1`, `ext_factor = 0`, `mscale = 1`, which is what llama.cpp uses for a model
//! without rope scaling), and each pair becomes `(x0*c - x1*s, x0*s + x1*c)` (`rotate_pairs` with
//! `n_offset = 1`).
//!
//! Every product is a separate f32 multiply: Rust does not contract `a*b - c*d` into a fused
//! multiply-add, and this module never calls `mul_add` (the seed document's kernel needs explicit
//! `float32()` casts for the same guarantee in Go). That makes a rotation a pure function of
//! (raw row, position, base): rotating a pre-RoPE row to position `p` gives the same bits at
//! prefill as at a later re-position, on every architecture, which theorem T2 of the seed document
//! relies on. ggml-cpu itself is compiled with `-mfma` under GCC's default `-ffp-contract=fast`,
//! and its rotation *is* contracted (the object code of `ggml_compute_forward_rope_flt<float>`
//! built with the flags of LLAMA-FACTS.md holds `vfmsub231ss`/`vfmadd132ss`), so llama.cpp's own
//! rotated keys can differ from these in the last bit.

use crate::Pos;

/// The `(cos, sin)` pair for each of the `head_dim / 2` rotation pairs at position `pos`, computed
/// as `ggml_rope_cache_init` does.
pub fn rope_cache(head_dim: usize, pos: Pos, freq_base: f32) -> Vec<(f32, f32)> {
    assert!(
        head_dim % 2 == 0,
        "RoPE needs an even head dimension, got {head_dim}"
    );
    let theta_scale = freq_base.powf(-2.0f32 / head_dim as f32);
    // ggml converts the int32 position to float (exact for |pos| < 2^24).
    let mut theta = pos as f32;
    let mut cache = Vec::with_capacity(head_dim / 2);
    for _ in 0..head_dim / 2 {
        cache.push((theta.cos(), theta.sin()));
        theta *= theta_scale;
    }
    cache
}

/// Rotates `x` (`n_heads` heads of `head_dim` values, head-major) in place to position `pos`.
/// `x` must hold the pre-RoPE values: applying this twice composes two rotations, which is not
/// bit-identical to one rotation by the sum.
pub fn rope_row(x: &mut [f32], n_heads: usize, head_dim: usize, pos: Pos, freq_base: f32) {
    assert_eq!(
        x.len(),
        n_heads * head_dim,
        "rope_row: row of {} values is not {n_heads} heads x {head_dim}",
        x.len()
    );
    let cache = rope_cache(head_dim, pos, freq_base);
    for head in x.chunks_exact_mut(head_dim) {
        for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(&cache) {
            let x0 = pair[0];
            let x1 = pair[1];
            pair[0] = x0 * c - x1 * s;
            pair[1] = x0 * s + x1 * c;
        }
    }
}

/// Returns a rotated copy of the pre-RoPE row `raw` at position `pos` (the single-rotation form a
/// KV cache uses to re-position a key).
pub fn rope_rotated(
    raw: &[f32],
    n_heads: usize,
    head_dim: usize,
    pos: Pos,
    freq_base: f32,
) -> Vec<f32> {
    let mut out = raw.to_vec();
    rope_row(&mut out, n_heads, head_dim, pos, freq_base);
    out
}
