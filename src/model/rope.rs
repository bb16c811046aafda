//! Rotary position embedding as llama.cpp applies it to arch `llama` (`LLAMA_ROPE_TYPE_NORM`):
//! adjacent pairs `(x[2i], x[2i+1])` of each head rotate by `theta_i = pos * base^(-2i/head_dim)`.
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
//! multiply-add, and this module never calls `mul_add`. That makes a rotation a pure function of
//! (raw row, position, base): rotating a pre-RoPE row to position `p` gives the same bits at
//! prefill as at a later re-position, which theorem T2 of the seed document relies on. ggml-cpu
//! itself is compiled with `-mfma` under GCC's default `-ffp-contract=fast`, and its rotation *is*
//! contracted (the object code of `ggml_compute_forward_rope_flt<float>` built with the flags of
//! LLAMA-FACTS.md holds `vfmsub231ss`/`vfmadd132ss`), so llama.cpp's own rotated keys can differ
//! from these in the last bit.

/// The `(cos, sin)` pair for each of the `head_dim / 2` rotation pairs at position `pos`, computed
/// as `ggml_rope_cache_init` does.
pub fn rope_cache(head_dim: usize, pos: i32, freq_base: f32) -> Vec<(f32, f32)> {
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
pub fn rope_row(x: &mut [f32], n_heads: usize, head_dim: usize, pos: i32, freq_base: f32) {
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
    pos: i32,
    freq_base: f32,
) -> Vec<f32> {
    let mut out = raw.to_vec();
    rope_row(&mut out, n_heads, head_dim, pos, freq_base);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761u32) ^ seed) % 2000) as f32 / 1000.0 - 1.0)
            .collect()
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn position_zero_is_identity() {
        let raw = row(4 * 16, 7);
        let mut x = raw.clone();
        rope_row(&mut x, 4, 16, 0, 10000.0);
        assert_eq!(bits(&x), bits(&raw));
    }

    #[test]
    fn single_rotation_from_raw_is_bit_identical() {
        let raw = row(2 * 16, 3);
        for pos in [1, 5, 17, 100, 511, 4096] {
            let at_prefill = rope_rotated(&raw, 2, 16, pos, 10000.0);
            // A later re-position: rotate somewhere else first, then again from the raw row.
            let _elsewhere = rope_rotated(&raw, 2, 16, pos + 3, 10000.0);
            let at_reposition = rope_rotated(&raw, 2, 16, pos, 10000.0);
            assert_eq!(bits(&at_prefill), bits(&at_reposition), "pos {pos}");
        }
    }

    #[test]
    fn composed_rotation_is_not_assumed_exact() {
        // Rotating by 3 then by 4 is the same rotation as 7 in exact arithmetic; in f32 it
        // usually is not bit-identical, which is why caches must keep the pre-RoPE row.
        let raw = row(4 * 16, 11);
        let direct = rope_rotated(&raw, 4, 16, 7, 10000.0);
        let mut composed = rope_rotated(&raw, 4, 16, 3, 10000.0);
        rope_row(&mut composed, 4, 16, 4, 10000.0);
        let max_diff = direct
            .iter()
            .zip(&composed)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(max_diff < 1e-5, "composed drifts too far: {max_diff}");
    }

    #[test]
    fn rotates_adjacent_pairs_by_the_ggml_angle() {
        // Pair i of every head rotates by pos * base^(-2i/hd); check against f64 math.
        let hd = 8;
        let pos = 3;
        let base = 10000.0f32;
        let raw = row(2 * hd, 5);
        let x = rope_rotated(&raw, 2, hd, pos, base);
        for h in 0..2 {
            for i in 0..hd / 2 {
                let theta = pos as f64 * (base as f64).powf(-2.0 * i as f64 / hd as f64);
                let (x0, x1) = (raw[h * hd + 2 * i] as f64, raw[h * hd + 2 * i + 1] as f64);
                let y0 = x0 * theta.cos() - x1 * theta.sin();
                let y1 = x0 * theta.sin() + x1 * theta.cos();
                assert!((x[h * hd + 2 * i] as f64 - y0).abs() < 1e-5);
                assert!((x[h * hd + 2 * i + 1] as f64 - y1).abs() < 1e-5);
            }
        }
    }
}
