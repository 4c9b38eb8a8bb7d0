//! Shared test helpers: random weights of every encoding, ggml's synthetic data, references.
#![allow(dead_code)]

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use synapse_formats::GgmlType;

/// ggml's `generate_data` from tests/test-quantize-fns.cpp.
pub fn generate_data(offset: f32, n: usize, amplitude: f32) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + amplitude * (i as f32 + offset).cos())
        .collect()
}

/// Where a block keeps its f16 scales, and the magnitude that makes decoded values O(1).
fn scale_fields(ty: GgmlType) -> &'static [(usize, f32)] {
    use GgmlType as T;
    match ty {
        T::Q8_0 => &[(0, 2.0 / 127.0)],
        T::Q4_0 => &[(0, 2.0 / 8.0)],
        T::Q4_1 => &[(0, 4.0 / 15.0), (2, -2.0)],
        T::Q5_0 => &[(0, 2.0 / 16.0)],
        T::Q5_1 => &[(0, 4.0 / 31.0), (2, -2.0)],
        T::Q4_K => &[(0, 4.0 / 15.0 / 63.0), (2, 2.0 / 63.0)],
        T::Q5_K => &[(0, 4.0 / 31.0 / 63.0), (2, 2.0 / 63.0)],
        T::Q6_K => &[(208, 2.0 / 32.0 / 127.0)],
        T::Q2_K => &[(80, 4.0 / 3.0 / 15.0), (82, 2.0 / 15.0)],
        T::Q3_K => &[(108, 2.0 / 4.0 / 32.0)],
        T::IQ4_NL | T::IQ4_XS => &[(0, 2.0 / 127.0)],
        T::TQ1_0 => &[(52, 1.5)],
        T::TQ2_0 => &[(64, 1.5)],
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S => &[(0, 0.1)],
        _ => &[],
    }
}

/// Random weights of `ty`, `rows × cols`, decoding to values of order 1.
pub fn random_weights(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| rng.random_range(-2f32..2.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.random_range(-2f32..2.0)).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.random_range(-2f32..2.0)).to_le_bytes())
            .collect(),
        _ => {
            let (ts, bs) = (ty.type_size(), ty.block_size());
            let mut out = vec![0u8; n / bs * ts];
            rng.fill(&mut out[..]);
            for b in out.chunks_exact_mut(ts) {
                for &(off, mag) in scale_fields(ty) {
                    let v = mag * rng.random_range(0.5f32..1.5);
                    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    b[0] = rng.random_range(124u8..128); // E8M0 exponent near 2^0
                }
            }
            out
        }
    }
}

/// f64 dot.
pub fn dot64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Σ|a·b|: the scale for relative comparisons between paths.
pub fn abs_dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 * y as f64).abs())
        .sum()
}

/// ggml's dot-product tolerance (test-quantize-fns.cpp) for the activation-quantized kernels.
pub fn dot_tolerance(ty: GgmlType) -> f32 {
    use GgmlType as T;
    match ty {
        T::TQ1_0 | T::TQ2_0 => 0.15,
        T::Q2_K
        | T::Q3_K
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ1_S
        | T::IQ1_M => 0.04,
        T::MXFP4 => 0.03,
        _ => 0.02,
    }
}
