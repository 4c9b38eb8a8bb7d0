//! Elementwise and row-wise ops the executor needs: RMSNorm, RoPE, softmax, activations.
//!
//! Written as plain slice loops the compiler vectorizes for the baseline target; they are a
//! small fraction of a token's time next to the matmuls and attention.

use crate::error::{KernelError, Result};
use crate::matrix::check_len;

/// RMSNorm of each row of `x` (rows of `weight.len()`), times `weight`, into `out`:
/// `out = x / sqrt(mean(x²) + eps) · weight`. (GGUF Gemma weights already include the `+1`.)
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    let d = weight.len();
    rows_of("rms_norm", x.len(), d)?;
    check_len("rms_norm", "out", x.len(), out.len())?;
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let s = inv_rms(xr, eps);
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * s * w;
        }
    }
    Ok(())
}

/// In-place RMSNorm of each row of `x` (rows of `weight.len()`), times `weight`.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) -> Result<()> {
    let d = weight.len();
    rows_of("rms_norm_inplace", x.len(), d)?;
    for xr in x.chunks_exact_mut(d) {
        let s = inv_rms(xr, eps);
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v *= s * w;
        }
    }
    Ok(())
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let mut acc = [0f32; 8];
    for (i, v) in x.iter().enumerate() {
        acc[i % 8] += v * v;
    }
    let ss: f32 = acc.iter().sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

fn rows_of(op: &'static str, len: usize, d: usize) -> Result<usize> {
    if d == 0 || !len.is_multiple_of(d) {
        return Err(KernelError::BadArgument {
            op,
            msg: format!("length {len} is not a multiple of row size {d}"),
        });
    }
    Ok(len / d)
}

/// Which elements RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0: Llama GGUFs).
    Normal,
    /// Halves `(x[i], x[i + d/2])` (ggml `GGML_ROPE_TYPE_NEOX`: Gemma, Qwen, GPT-NeoX).
    Neox,
}

/// Rotary position embedding with precomputed inverse frequencies:
/// `θᵢ = freq_scale · pos · base^(−2i/rot_dims)` for `i < rot_dims/2`, as ggml computes it.
#[derive(Debug, Clone)]
pub struct Rope {
    head_dim: usize,
    rot_dims: usize,
    mode: RopeMode,
    inv_freq: Vec<f32>,
    freq_scale: f32,
}

impl Rope {
    /// A rotation over the first `rot_dims` (even, ≤ `head_dim`) dims of each head.
    pub fn new(
        head_dim: usize,
        rot_dims: usize,
        base: f32,
        freq_scale: f32,
        mode: RopeMode,
    ) -> Result<Self> {
        if rot_dims == 0 || !rot_dims.is_multiple_of(2) || rot_dims > head_dim {
            return Err(KernelError::BadArgument {
                op: "rope",
                msg: format!(
                    "rot_dims {rot_dims} must be even, non-zero and ≤ head_dim {head_dim}"
                ),
            });
        }
        let inv_freq = (0..rot_dims / 2)
            .map(|i| (base as f64).powf(-2.0 * i as f64 / rot_dims as f64) as f32)
            .collect();
        Ok(Self {
            head_dim,
            rot_dims,
            mode,
            inv_freq,
            freq_scale,
        })
    }

    /// Rotates every head of `x` (`n_heads × head_dim` for one token) for position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) -> Result<()> {
        rows_of("rope", x.len(), self.head_dim)?;
        let half = self.rot_dims / 2;
        let p = pos as f32 * self.freq_scale;
        for h in x.chunks_exact_mut(self.head_dim) {
            for (i, &f) in self.inv_freq.iter().enumerate() {
                let (s, c) = (p * f).sin_cos();
                let (a, b) = match self.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c - x1 * s;
                h[b] = x0 * s + x1 * c;
            }
        }
        Ok(())
    }

    /// Rotates `n` tokens (`x` is `n × n_heads × head_dim`) at positions `pos[t]`.
    pub fn apply_rows(&self, x: &mut [f32], pos: &[usize]) -> Result<()> {
        let per = if pos.is_empty() {
            0
        } else {
            x.len() / pos.len()
        };
        check_len("rope", "x", per * pos.len(), x.len())?;
        if pos.is_empty() {
            return Ok(());
        }
        for (row, &p) in x.chunks_exact_mut(per).zip(pos) {
            self.apply(row, p)?;
        }
        Ok(())
    }
}

/// In-place softmax of one row (max-subtracted; an all −∞ row becomes all zeros).
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        x.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// SiLU `x·σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (`0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, ggml's `gelu`).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * x * (1.0 + 0.044_715 * x * x)).tanh())
}

/// Squared ReLU `max(x, 0)²`.
#[inline]
pub fn relu2(x: f32) -> f32 {
    let r = x.max(0.0);
    r * r
}

/// In-place SiLU.
pub fn silu_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

/// In-place GELU (tanh approximation).
pub fn gelu_tanh_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
}

/// In-place squared ReLU.
pub fn relu2_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = relu2(*v));
}

/// Gated FFN activation: `gate = act(gate) · up`, elementwise.
pub fn gated(act: Activation, gate: &mut [f32], up: &[f32]) -> Result<()> {
    check_len("gated", "up", gate.len(), up.len())?;
    let f = act.func();
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = f(*g) * u;
    }
    Ok(())
}

/// An activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x·σ(x)` (Llama, Qwen: SwiGLU).
    Silu,
    /// GELU, tanh approximation (Gemma: GeGLU).
    GeluTanh,
    /// `max(x,0)²` (BitNet).
    Relu2,
}

impl Activation {
    /// The scalar function.
    pub fn func(self) -> fn(f32) -> f32 {
        match self {
            Activation::Silu => silu,
            Activation::GeluTanh => gelu_tanh,
            Activation::Relu2 => relu2,
        }
    }
}

/// `a += b`, elementwise.
pub fn add_inplace(a: &mut [f32], b: &[f32]) -> Result<()> {
    check_len("add_inplace", "b", a.len(), b.len())?;
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
    Ok(())
}

/// `a *= s`.
pub fn scale_inplace(a: &mut [f32], s: f32) {
    a.iter_mut().for_each(|x| *x *= s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 20.0) * 0.3).collect();
        let mut out = vec![0.0; 64];
        rms_norm(&x, &[1.0; 64], 0.0, &mut out).unwrap();
        let ms: f32 = out.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            let r = Rope::new(8, 8, 10000.0, 1.0, mode).unwrap();
            let x0: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
            let mut x = x0.clone();
            r.apply(&mut x, 0).unwrap();
            assert_eq!(x, x0);
            r.apply(&mut x, 17).unwrap();
            let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((n(&x) - n(&x0)).abs() < 1e-4);
        }
    }

    #[test]
    fn rope_neox_pairs_halves() {
        // Only dims 0 and 2 (of 4) are non-zero: NeoX rotates (0,2) together, Normal (0,1),(2,3).
        let r = Rope::new(4, 4, 10000.0, 1.0, RopeMode::Neox).unwrap();
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        r.apply(&mut x, 1).unwrap();
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
    }

    #[test]
    fn softmax_sums_to_one_and_handles_masked_rows() {
        let mut x = vec![1.0, 2.0, 3.0, f32::NEG_INFINITY];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        let mut m = vec![f32::NEG_INFINITY; 3];
        softmax(&mut m);
        assert_eq!(m, vec![0.0; 3]);
    }

    #[test]
    fn activations_reference_values() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert_eq!(relu2(-3.0), 0.0);
        assert_eq!(relu2(3.0), 9.0);
    }
}
