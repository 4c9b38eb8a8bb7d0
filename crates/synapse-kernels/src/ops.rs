//! Elementwise and row-wise ops with ggml's numerics (the order of operations and precisions
//! that llama.cpp's CPU backend uses), so that Synapse's activations track llama.cpp's bit for
//! bit: RMSNorm with an f64 sum of squares, RoPE with ggml's iterated angles and its x86
//! build's FMA contractions, GeGLU through ggml's f16 GELU table. SwiGLU and the attention
//! primitives live in [`crate::ggml_f32`].
//!
//! Shapes come in as numbers (slice lengths, `n_rot`); the caller splits rows and heads.

use std::sync::OnceLock;

use half::f16;

/// `y = x / sqrt(mean(x²) + eps) * w`, the sum of squares accumulated in f64 as ggml does
/// (one row of [`rms_norm_rows`]).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    rms_norm_rows(x, x.len(), w, eps, y)
}

/// In-place variant of [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let cols = x.len();
    rms_norm_rows_inplace(x, cols, w, eps)
}

/// [`rms_norm_inplace`] of every `cols`-element row of `x` (a prompt's rows, or a row's
/// heads), bit for bit: each row's sum of squares is still one f64 chain in element order,
/// but up to [`ROWS_AT_ONCE`] rows' chains advance together, so the adds' latency overlaps
/// (one row alone waits an add's latency per element: the post-norms and the per-head q/k
/// norms of an 8-stream decode step were ~2% of its time on the main thread).
pub fn rms_norm_rows_inplace(x: &mut [f32], cols: usize, w: &[f32], eps: f32) {
    if cols == 0 {
        return;
    }
    for g in x.chunks_mut(ROWS_AT_ONCE * cols) {
        let scales = row_scales(g, cols, eps);
        for (row, &scale) in g.chunks_exact_mut(cols).zip(&scales) {
            for (x, &w) in row.iter_mut().zip(w) {
                *x = (*x * scale) * w;
            }
        }
    }
}

/// [`rms_norm`] of every `cols`-element row of `x` into the rows of `y`, as
/// [`rms_norm_rows_inplace`] does it.
pub fn rms_norm_rows(x: &[f32], cols: usize, w: &[f32], eps: f32, y: &mut [f32]) {
    if cols == 0 {
        return;
    }
    for (g, yg) in x
        .chunks(ROWS_AT_ONCE * cols)
        .zip(y.chunks_mut(ROWS_AT_ONCE * cols))
    {
        let scales = row_scales(g, cols, eps);
        for ((row, yr), &scale) in g
            .chunks_exact(cols)
            .zip(yg.chunks_exact_mut(cols))
            .zip(&scales)
        {
            for ((y, &x), &w) in yr.iter_mut().zip(row).zip(w) {
                *y = (x * scale) * w;
            }
        }
    }
}

/// Rows whose f64 sums of squares [`rms_norm_rows_inplace`] advances together.
pub const ROWS_AT_ONCE: usize = 8;

/// `1 / sqrt(mean(x²) + eps)` of each of the (at most [`ROWS_AT_ONCE`]) `cols`-element rows
/// of `g`, each an f64 chain in element order (ggml's `rms_norm`).
fn row_scales(g: &[f32], cols: usize, eps: f32) -> [f32; ROWS_AT_ONCE] {
    let k = g.len() / cols;
    let mut sums = [0.0f64; ROWS_AT_ONCE];
    if k == ROWS_AT_ONCE {
        // A constant row count: the eight chains stay in registers.
        for i in 0..cols {
            for (r, s) in sums.iter_mut().enumerate() {
                let v = g[r * cols + i];
                *s += (v * v) as f64;
            }
        }
    } else {
        for i in 0..cols {
            for (r, s) in sums.iter_mut().enumerate().take(k) {
                let v = g[r * cols + i];
                *s += (v * v) as f64;
            }
        }
    }
    let mut out = [0.0f32; ROWS_AT_ONCE];
    for (o, &sum) in out.iter_mut().zip(&sums).take(k) {
        let mean = (sum / cols as f64) as f32;
        *o = 1.0 / (mean + eps).sqrt();
    }
    out
}

/// Which elements of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (ggml mode 0, "normal": GGUF Llama).
    Normal,
    /// Halves `(x[i], x[i + n_rot/2])` (ggml `GGML_ROPE_TYPE_NEOX`: Gemma, Qwen, HF
    /// `rotate_half`).
    Neox,
}

/// Fills `cs` with `(cos, sin)` for the `n_rot / 2` pairs at position `pos`, the way ggml's
/// rope cache does: θ advances by repeated multiplication by `base^(-2/n_rot)` in f32.
pub fn rope_cache(
    pos: u32,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    freq_factors: Option<&[f32]>,
    cs: &mut [(f32, f32)],
) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cs.iter_mut().enumerate().take(n_rot / 2) {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = freq_scale * (theta / ff);
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
}

/// One rotation, rounded as ggml's x86 build computes it: GCC contracts
/// `x0·c − x1·s` into `fma(x0, c, −(x1·s))` (and `x0·s + x1·c` into `fma(x0, s, x1·c)`),
/// verified bit for bit against llama.cpp's RoPE output on the default model.
#[inline(always)]
fn rot(x0: f32, x1: f32, c: f32, s: f32) -> (f32, f32) {
    (x0.mul_add(c, -(x1 * s)), x0.mul_add(s, x1 * c))
}

/// Rotates one head in place with a cache from [`rope_cache`].
pub fn rope_apply(x: &mut [f32], n_rot: usize, style: RopeStyle, cs: &[(f32, f32)]) {
    // `mul_add` is a call into libm's `fmaf` unless the code is compiled for FMA: the same
    // body with FMA enabled where the CPU has it (one fused instruction, the same rounding).
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above).
        return unsafe { rope_apply_fma(x, n_rot, style, cs) };
    }
    rope_apply_body(x, n_rot, style, cs)
}

/// [`rope_apply`] compiled with FMA.
///
/// # Safety
/// The CPU has FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_apply_fma(x: &mut [f32], n_rot: usize, style: RopeStyle, cs: &[(f32, f32)]) {
    rope_apply_body(x, n_rot, style, cs)
}

#[inline(always)]
fn rope_apply_body(x: &mut [f32], n_rot: usize, style: RopeStyle, cs: &[(f32, f32)]) {
    match style {
        RopeStyle::Neox => {
            let h = n_rot / 2;
            for (i, &(c, s)) in cs.iter().enumerate().take(h) {
                let (a, b) = rot(x[i], x[i + h], c, s);
                x[i] = a;
                x[i + h] = b;
            }
        }
        RopeStyle::Normal => {
            for (i, &(c, s)) in cs.iter().enumerate().take(n_rot / 2) {
                let (a, b) = rot(x[2 * i], x[2 * i + 1], c, s);
                x[2 * i] = a;
                x[2 * i + 1] = b;
            }
        }
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_COEF_A: f32 = 0.044715;

/// GELU, tanh approximation (`0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²)))`), in f32.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// ggml's table entry: its `ggml_gelu_f32` as the x86 build rounds it (GCC contracts
/// `1 + a·x·x` into `fma(a·x, x, 1)`); all 65 536 entries checked against the table in
/// llama-cpp-python's libggml-cpu.
fn gelu_table_entry(x: f32) -> f32 {
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

fn gelu_table() -> &'static [f16] {
    static T: OnceLock<Vec<f16>> = OnceLock::new();
    T.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu_table_entry(f16::from_bits(b).to_f32())))
            .collect()
    })
}

/// [`gelu_table`] widened to f32 (exactly), for the AVX2 path's gathers.
#[cfg(target_arch = "x86_64")]
fn gelu_table_f32() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| gelu_table().iter().map(|h| h.to_f32()).collect())
}

/// The table form of [`geglu`], element by element (the reference the AVX2 path equals).
fn geglu_table_scalar(g: &[f32], u: &[f32], y: &mut [f32]) {
    let t = gelu_table();
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        *y = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            t[f16::from_f32(g).to_bits() as usize].to_f32() * u
        };
    }
}

/// [`geglu_table_scalar`] eight at a time: `vcvtps2ph` (round to nearest even, as
/// `f16::from_f32`), a gather from the f32-widened table, the same product, and the two
/// range cases blended in (their comparisons false for NaN, as the scalar branches).
///
/// # Safety
/// The CPU has AVX2 and F16C; `g`, `u` and `y` have the same length, a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn geglu_table_avx2(g: &[f32], u: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let t = gelu_table_f32();
    // SAFETY: every index is below the slices' common length; the gathered indices are
    // f16 bit patterns, below the table's 65 536 entries.
    unsafe {
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        for i in (0..y.len()).step_by(8) {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let uv = _mm256_loadu_ps(u.as_ptr().add(i));
            let idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(gv));
            let tv = _mm256_i32gather_ps::<4>(t.as_ptr(), idx);
            let r = _mm256_blendv_ps(
                _mm256_mul_ps(tv, uv),
                _mm256_mul_ps(gv, uv),
                _mm256_cmp_ps::<_CMP_GE_OQ>(gv, hi),
            );
            let r = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(gv, lo), r);
            _mm256_storeu_ps(y.as_mut_ptr().add(i), r);
        }
    }
}

/// `y = gelu(g) * u`. With `table`, GELU goes through an fp16 lookup as in ggml (input
/// rounded to f16, output stored as f16; identity above 10, zero below −10).
pub fn geglu(g: &[f32], u: &[f32], y: &mut [f32], table: bool) {
    if table {
        let n = y.len().min(g.len()).min(u.len());
        #[cfg(target_arch = "x86_64")]
        if crate::ggml_f32::has_f16c() {
            let m = n / 8 * 8;
            // SAFETY: AVX2 and F16C checked (`has_f16c`); the three slices are cut to `m`, a
            // multiple of 8.
            unsafe { geglu_table_avx2(&g[..m], &u[..m], &mut y[..m]) };
            geglu_table_scalar(&g[m..n], &u[m..n], &mut y[m..n]);
            return;
        }
        geglu_table_scalar(&g[..n], &u[..n], &mut y[..n]);
    } else {
        for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
            *y = gelu_tanh(g) * u;
        }
    }
}

/// `y = max(g, 0)² * u` (transformers' `relu2` gate: `square(relu(g))`, then the product,
/// each rounded to f32 as torch does).
pub fn reglu2(g: &[f32], u: &[f32], y: &mut [f32]) {
    for ((y, &g), &u) in y.iter_mut().zip(g).zip(u) {
        let r = g.max(0.0);
        *y = (r * r) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reglu2_squares_the_positive_part() {
        let mut y = [0.0f32; 4];
        reglu2(&[-2.0, 0.0, 1.5, 3.0], &[5.0, 5.0, 2.0, -1.0], &mut y);
        assert_eq!(y, [0.0, 0.0, 4.5, -9.0]);
    }

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
        let w = vec![1.0; 64];
        let mut y = vec![0.0; 64];
        rms_norm(&x, &w, 0.0, &mut y);
        let ms: f32 = y.iter().map(|v| v * v).sum::<f32>() / 64.0;
        assert!((ms - 1.0).abs() < 1e-5);
        let mut z = x.clone();
        rms_norm_inplace(&mut z, &w, 0.0);
        assert!(y.iter().zip(&z).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    /// The many-row norms equal the one-row ones bit for bit, for every row count up to
    /// past two groups and odd widths.
    #[test]
    fn rms_norm_rows_equal_one_row_at_a_time() {
        let mut st = 0x9e37_79b9_7f4a_7c15u64;
        for cols in [1usize, 7, 64, 256, 640] {
            let w: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 13) as f32 * 0.1).collect();
            for rows in 1..=19 {
                let x: Vec<f32> = (0..rows * cols)
                    .map(|_| {
                        st ^= st << 13;
                        st ^= st >> 7;
                        st ^= st << 17;
                        ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
                    })
                    .collect();
                let mut want = x.clone();
                for r in want.chunks_exact_mut(cols) {
                    rms_norm_inplace(r, &w, 1e-6);
                }
                let mut got = x.clone();
                rms_norm_rows_inplace(&mut got, cols, &w, 1e-6);
                let mut got2 = vec![f32::NAN; x.len()];
                rms_norm_rows(&x, cols, &w, 1e-6, &mut got2);
                for (i, ((a, b), c)) in want.iter().zip(&got).zip(&got2).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "cols {cols} rows {rows} at {i}");
                    assert_eq!(a.to_bits(), c.to_bits(), "cols {cols} rows {rows} at {i}");
                }
            }
        }
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let mut cs = vec![(0.0, 0.0); 8];
            rope_cache(0, 16, 10000.0, 1.0, None, &mut cs);
            let x0: Vec<f32> = (0..16).map(|i| i as f32).collect();
            let mut x = x0.clone();
            rope_apply(&mut x, 16, style, &cs);
            assert_eq!(x, x0);
            rope_cache(37, 16, 10000.0, 1.0, None, &mut cs);
            rope_apply(&mut x, 16, style, &cs);
            let n0: f32 = x0.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() / n0 < 1e-5, "{style:?}");
        }
    }

    #[test]
    fn rope_neox_pairs_halves_and_normal_pairs_neighbours() {
        // Only dim 0 (of 4) is non-zero; at position 1 the first pair turns by 1 radian. NeoX
        // rotates (0, 2) together, Normal (0, 1).
        let mut cs = vec![(0.0, 0.0); 2];
        rope_cache(1, 4, 10000.0, 1.0, None, &mut cs);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope_apply(&mut x, 4, RopeStyle::Neox, &cs);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        assert_eq!((x[1], x[3]), (0.0, 0.0));
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope_apply(&mut x, 4, RopeStyle::Normal, &cs);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[1] - 1f32.sin()).abs() < 1e-6);
        assert_eq!((x[2], x[3]), (0.0, 0.0));
    }

    /// The AVX2 table path equals the element-by-element one bit for bit: every f16 value
    /// (and the halfway points between neighbours, which test the rounding), ±10 and just
    /// past them, infinities and NaN, at a length that leaves a scalar tail.
    #[test]
    fn geglu_table_simd_equals_the_scalar_path() {
        let mut g: Vec<f32> = Vec::new();
        for b in 0..=u16::MAX {
            let x = f16::from_bits(b).to_f32();
            let next = f16::from_bits(b.wrapping_add(1)).to_f32();
            g.push(x);
            if x.is_finite() && next.is_finite() {
                g.push(0.5 * (x + next));
            }
        }
        for x in [
            -10.0f32,
            10.0,
            -10.000001,
            9.999999,
            -9.999999,
            10.000001,
            f32::NAN,
        ] {
            // Twice: the factors below alternate in sign, so a −0.0 against a +0.0 shows.
            g.extend([x, x]);
        }
        while g.len() % 8 != 5 {
            g.push(1.0);
        }
        let u: Vec<f32> = (0..g.len())
            .map(|i| (0.75 + (i % 13) as f32 * 0.37) * if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let mut got = vec![f32::NAN; g.len()];
        let mut want = vec![f32::NAN; g.len()];
        geglu(&g, &u, &mut got, true);
        geglu_table_scalar(&g, &u, &mut want);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "g {} u {}: {a} vs {b}",
                g[i],
                u[i]
            );
        }
    }

    #[test]
    fn gelu_reference_value_and_table_close_to_formula() {
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        for i in -200..200 {
            let g = i as f32 * 0.05;
            let mut a = [0.0];
            let mut b = [0.0];
            geglu(&[g], &[1.0], &mut a, true);
            geglu(&[g], &[1.0], &mut b, false);
            assert!(
                (a[0] - b[0]).abs() <= 2e-3 * (1.0 + b[0].abs()),
                "{g}: {} {}",
                a[0],
                b[0]
            );
        }
    }
}
