//! Rotary position embedding as llama.cpp applies it to arch `llama` (`LLAMA_ROPE_TYPE_NORM`).
//!
//! The implementation lives in the `native-kv` crate ([`native_kv::rope`]), so that the tensor
//! payload of the native cache re-positions keys with the very code this reference rotates them
//! with (one piece of code, bit-identical at prefill and at re-position). Its documentation
//! follows ggml-cpu step by step and says why no product is fused. These tests pin it from the
//! reference's side.

pub use native_kv::rope::{rope_cache, rope_rotated, rope_row};

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
