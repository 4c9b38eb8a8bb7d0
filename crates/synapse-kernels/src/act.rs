//! Activation formats: activations are quantized once per matmul to 8-bit blocks that carry
//! their sums, so a weight block's offset or minimum costs one multiply per block instead of
//! one per element.
//!
//! - [`BlockQ8x32`]: 32 values, f16-rounded scale and ggml's `d·Σq` (for Q4_0…Q8_0).
//! - [`BlockQ8K`]: 256 values, f32 scale, i16 sums of each 16 quants (for the k-quants).
//!
//! Both reproduce ggml's own activation quantizers bit for bit (`quantize_row_q8_0`,
//! `quantize_row_q8_K_ref`): same scale arithmetic, f16-rounded Q8_0 scale, round half to
//! even, so a matmul over ggml's weight formats sees the very integers ggml's `vec_dot` sees.

use bytemuck::{Pod, Zeroable};

/// 32 activations quantized to i8: ggml's `block_q8_0` / `block_q8_1` in f32 fields.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub(crate) struct BlockQ8x32 {
    /// The scale, f16-rounded as ggml stores it.
    pub d: f32,
    /// ggml's `block_q8_1::s`: `d·Σq` (unrounded `d`) rounded to f16.
    pub s: f32,
    pub qs: [i8; 32],
}

/// 256 activations quantized to i8 with one f32 scale and the sum of each 16 quants.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
pub(crate) struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

/// Which activation format a weight encoding's kernel consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActKind {
    /// Plain f32 (float weights and the decode-then-dot paths).
    F32,
    /// f16 bits, rounded to nearest even (ggml's `vec_dot_type` for F16 weights).
    F16,
    /// bf16 bits as ggml's `fp32_to_bf16` makes them (round to nearest even, NaN quieted; the
    /// `vec_dot_type` of BF16 weights in ggml's order).
    Bf16,
    /// [`BlockQ8x32`] blocks.
    Q8x32,
    /// [`BlockQ8K`] blocks.
    Q8K,
    /// [`BlockQ8K`] blocks with one scale for the whole row: BitNet's 8-bit absmax
    /// activations (transformers' `ActQuant`: `a = 127 / max(max|x|, 1e-5)`,
    /// `q = clamp(round_half_even(x·a), −128, 127)`, every block's `d = 1/a`).
    Q8KRow,
}

impl ActKind {
    /// Bytes one activation row of `cols` values takes in this format.
    pub(crate) fn row_bytes(self, cols: usize) -> usize {
        match self {
            ActKind::F32 => cols * 4,
            ActKind::F16 | ActKind::Bf16 => cols * 2,
            ActKind::Q8x32 => cols / 32 * std::mem::size_of::<BlockQ8x32>(),
            ActKind::Q8K | ActKind::Q8KRow => cols / 256 * std::mem::size_of::<BlockQ8K>(),
        }
    }
}

#[inline]
fn f16r(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// Round half to even, as ggml's `nearest_int` and `_mm256_round_ps(_MM_ROUND_NEAREST)` do.
#[inline]
fn q(v: f32, id: f32) -> i8 {
    (v * id).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// Quantizes `x` (a multiple of 32 long) into `out` (`x.len() / 32` blocks), exactly as
/// ggml's `quantize_row_q8_0` (x86 AVX path): `d = amax / 127` stored as f16, the quants
/// computed with `id = 127 / amax` in f32, round half to even.
#[inline(always)]
pub(crate) fn quantize_q8x32(x: &[f32], out: &mut [BlockQ8x32]) {
    debug_assert_eq!(x.len(), out.len() * 32);
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = f16r(d);
        let mut s = 0i32;
        for (o, v) in b.qs.iter_mut().zip(xb) {
            *o = q(*v, id);
            s += *o as i32;
        }
        b.s = f16r(d * s as f32);
    }
}

/// Quantizes `x` (a multiple of 256 long) into `out` (`x.len() / 256` blocks), exactly as
/// ggml's `quantize_row_q8_K_ref` (which x86 uses): ggml computes `iscale = -127 / max` (max
/// = the signed value of largest magnitude), quants `nearest_int(iscale·x)` and `d = 1 /
/// iscale`; both signs of that are the same products as `id = 127 / amax`, quants
/// `round(id·x)`, `d = 1 / id`, stored here in that positive orientation.
#[inline(always)]
pub(crate) fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            b.d = 0.0;
            b.qs = [0; 256];
            b.bsums = [0; 16];
            continue;
        }
        let id = 127.0 / amax;
        b.d = 1.0 / id;
        for (o, v) in b.qs.iter_mut().zip(xb) {
            *o = q(*v, id);
        }
        for (g, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[g * 16..g * 16 + 16].iter().map(|&v| v as i16).sum();
        }
    }
}

/// ggml's `ggml_compute_fp32_to_bf16`: round to nearest even; a NaN keeps its top bits and is
/// made quiet.
#[inline(always)]
fn fp32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

#[inline(always)]
fn quantize_rows_body(kind: ActKind, x: &[f32], cols: usize, out: &mut [u8]) {
    let rb = kind.row_bytes(cols);
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
        match kind {
            ActKind::F32 => or.copy_from_slice(bytemuck::cast_slice(xr)),
            // Round to nearest even, eight at a time with F16C where the CPU has it (ggml's
            // `fp32_to_fp16` conversion): the same bits as `f16::from_f32` one by one.
            ActKind::F16 => {
                use half::slice::HalfFloatSliceExt;
                bytemuck::cast_slice_mut::<u8, half::f16>(or).convert_from_f32_slice(xr);
            }
            ActKind::Bf16 => {
                for (o, &v) in bytemuck::cast_slice_mut::<u8, u16>(or).iter_mut().zip(xr) {
                    *o = fp32_to_bf16(v);
                }
            }
            ActKind::Q8x32 => quantize_q8x32(xr, bytemuck::cast_slice_mut(or)),
            ActKind::Q8K => quantize_q8k(xr, bytemuck::cast_slice_mut(or)),
            ActKind::Q8KRow => quantize_q8k_row(xr, bytemuck::cast_slice_mut(or)),
        }
    }
}

/// [`ActKind::Q8KRow`]: one row (a whole number of 256-blocks). Inlined into the AVX2 build of
/// `quantize_rows`, so the rounding is `vroundps`, not a libm call.
#[inline(always)]
fn quantize_q8k_row(x: &[f32], out: &mut [BlockQ8K]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let a = 127.0 / amax.max(1e-5);
    let d = 1.0 / a;
    for (b, xb) in out.iter_mut().zip(x.chunks_exact(256)) {
        b.d = d;
        for (o, v) in b.qs.iter_mut().zip(xb) {
            *o = (v * a).round_ties_even().clamp(-128.0, 127.0) as i8;
        }
        for (g, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[g * 16..g * 16 + 16].iter().map(|&v| v as i16).sum();
        }
    }
}

/// Quantizes `n` rows of `cols` activations into `out` in format `kind` (rows back to back).
/// Compiled for AVX2 where the CPU has it (the rounding becomes `vroundps` instead of a libm
/// call); the results are the same bits either way.
pub(crate) fn quantize_rows(kind: ActKind, x: &[f32], cols: usize, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn fast(kind: ActKind, x: &[f32], cols: usize, out: &mut [u8]) {
            quantize_rows_body(kind, x, cols, out)
        }
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if matches!(kind, ActKind::Q8x32 | ActKind::Q8K)
            && *AVX512.get_or_init(|| {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            })
        {
            let rb = kind.row_bytes(cols);
            for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
                // SAFETY: the CPU has AVX-512 F and BW (checked at run time).
                unsafe {
                    match kind {
                        ActKind::Q8x32 => avx512::q8x32(xr, bytemuck::cast_slice_mut(or)),
                        ActKind::Q8K => avx512::q8k(xr, bytemuck::cast_slice_mut(or)),
                        ActKind::F32 | ActKind::F16 | ActKind::Bf16 | ActKind::Q8KRow => {
                            unreachable!("not taken here")
                        }
                    }
                }
            }
            return;
        }
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *AVX2.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }) {
            if matches!(kind, ActKind::Q8x32 | ActKind::Q8K) {
                let rb = kind.row_bytes(cols);
                for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(rb)) {
                    // SAFETY: the CPU has AVX2 (checked at run time).
                    unsafe {
                        if kind == ActKind::Q8x32 {
                            avx2::q8x32(xr, bytemuck::cast_slice_mut(or))
                        } else {
                            avx2::q8k(xr, bytemuck::cast_slice_mut(or))
                        }
                    }
                }
                return;
            }
            // SAFETY: the CPU has AVX2 and FMA (checked at run time).
            return unsafe { fast(kind, x, cols, out) };
        }
    }
    quantize_rows_body(kind, x, cols, out)
}

/// The same quantizers on AVX-512: the amax, the `x·id` products, round half to even
/// (`vcvtps2dq` under the default rounding mode) and the integer sums are the scalar code's
/// values, so the blocks are bit-identical (tested below).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{BlockQ8K, BlockQ8x32, f16r};
    use std::arch::x86_64::*;

    /// Quants of `v·id`, rounded half to even and clamped to ±127, as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn quants(v: __m512, id: __m512) -> __m512i {
        let q = _mm512_cvtps_epi32(_mm512_mul_ps(v, id));
        _mm512_min_epi32(
            _mm512_max_epi32(q, _mm512_set1_epi32(-127)),
            _mm512_set1_epi32(127),
        )
    }

    /// Four registers of quants (each in ±127) as 64 bytes in order: saturating packs (exact
    /// for these values) and one permute. `vpmovdb` to memory, what LLVM made of
    /// `_mm512_cvtepi32_epi8` + a store, is microcoded on Zen 4: it held half the samples of
    /// the Q8_K quantizer in a decode profile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn bytes4(q: [__m512i; 4]) -> __m512i {
        // Per 128-bit lane j: the dwords [q0_j, q1_j, q2_j, q3_j] (4 quants each).
        let b = _mm512_packs_epi16(
            _mm512_packs_epi32(q[0], q[1]),
            _mm512_packs_epi32(q[2], q[3]),
        );
        let idx = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
        _mm512_permutexvar_epi32(idx, b)
    }

    /// Four registers' lane sums, per 128-bit lane j: `[Σ_j q0, Σ_j q1, Σ_j q2, Σ_j q3]`
    /// (Σ_j over the lane's four dwords).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn lane_sums4(q: [__m512i; 4]) -> __m512i {
        let t0 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(q[0], q[1]),
            _mm512_unpackhi_epi32(q[0], q[1]),
        );
        let t1 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(q[2], q[3]),
            _mm512_unpackhi_epi32(q[2], q[3]),
        );
        _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1))
    }

    /// The 16 registers' sums from four [`lane_sums4`]: register `4g + k`'s in dword
    /// `4g + k`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn sums4(u: [__m512i; 4]) -> __m512i {
        // [u0.l0 + u0.l1, u0.l2 + u0.l3, u1.l0 + u1.l1, u1.l2 + u1.l3], and for u2, u3.
        let w01 = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(u[0], u[1]),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(u[0], u[1]),
        );
        let w23 = _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(u[2], u[3]),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(u[2], u[3]),
        );
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(w01, w23),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(w01, w23),
        )
    }

    /// [`super::quantize_q8x32`] on AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q8x32(x: &[f32], out: &mut [BlockQ8x32]) {
        for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
            // SAFETY: `xb` holds 32 floats; `b.qs` 32 bytes.
            unsafe {
                let v0 = _mm512_loadu_ps(xb.as_ptr());
                let v1 = _mm512_loadu_ps(xb.as_ptr().add(16));
                let amax =
                    _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
                let d = amax / 127.0;
                let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                b.d = f16r(d);
                let (q0, q1) = (quants(v0, id), quants(v1, id));
                let z = _mm512_setzero_si512();
                _mm256_storeu_si256(
                    b.qs.as_mut_ptr().cast(),
                    _mm512_castsi512_si256(bytes4([q0, q1, z, z])),
                );
                let s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
                b.s = f16r(d * s as f32);
            }
        }
    }

    /// [`super::quantize_q8k`] on AVX-512.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn q8k(x: &[f32], out: &mut [BlockQ8K]) {
        for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
            // SAFETY: `xb` holds 256 floats; `b.qs` 256 bytes.
            unsafe {
                let mut m = _mm512_setzero_ps();
                for i in 0..16 {
                    m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb.as_ptr().add(16 * i))));
                }
                let amax = _mm512_reduce_max_ps(m);
                if amax == 0.0 {
                    b.d = 0.0;
                    b.qs = [0; 256];
                    b.bsums = [0; 16];
                    continue;
                }
                let id = 127.0 / amax;
                b.d = 1.0 / id;
                let idv = _mm512_set1_ps(id);
                let mut sums = [_mm512_setzero_si512(); 4];
                for (g, sg) in sums.iter_mut().enumerate() {
                    let q: [__m512i; 4] = std::array::from_fn(|k| {
                        quants(_mm512_loadu_ps(xb.as_ptr().add(64 * g + 16 * k)), idv)
                    });
                    _mm512_storeu_si512(b.qs.as_mut_ptr().add(64 * g).cast(), bytes4(q));
                    *sg = lane_sums4(q);
                }
                // Each 16 quants' sum (exact integers, |Σ| ≤ 16·127) as i16.
                let all = sums4(sums);
                _mm256_storeu_si256(
                    b.bsums.as_mut_ptr().cast(),
                    _mm512_castsi512_si256(_mm512_permutexvar_epi64(
                        _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0),
                        _mm512_packs_epi32(all, all),
                    )),
                );
            }
        }
    }
}

/// The Q8 activation quantizers on AVX2: the scalar code's operations eight lanes at a time
/// (the largest magnitude is exact in any order; `v·id` rounded half to even by
/// `vcvtps2dq`, clamped to ±127), so the blocks are bit-identical (tested below).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BlockQ8K, BlockQ8x32, f16r};
    use std::arch::x86_64::*;

    /// The largest |v| of `n` registers of eight at `p` (NaNs skipped, as `f32::max` does:
    /// `max_ps` returns its second operand, the running maximum, when the first is a NaN).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn amax(p: *const f32, n: usize) -> f32 {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        for i in 0..n {
            // SAFETY: 8·n floats at `p` (caller).
            m = _mm256_max_ps(
                _mm256_andnot_ps(sign, unsafe { _mm256_loadu_ps(p.add(8 * i)) }),
                m,
            );
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)))
    }

    /// Quants of `v·id`, rounded half to even and clamped to ±127, as i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn quants(v: __m256, id: __m256) -> __m256i {
        let q = _mm256_cvtps_epi32(_mm256_mul_ps(v, id));
        _mm256_min_epi32(
            _mm256_max_epi32(q, _mm256_set1_epi32(-127)),
            _mm256_set1_epi32(127),
        )
    }

    /// Four registers of i32 quants (in ±127) as 32 bytes in element order.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn bytes(q: [__m256i; 4]) -> __m256i {
        // packs interleave the 128-bit halves: words [q0.lo q1.lo q0.hi q1.hi], bytes
        // [q0.lo q1.lo q2.lo q3.lo | q0.hi q1.hi q2.hi q3.hi] in 4-byte groups; restore.
        let w01 = _mm256_packs_epi32(q[0], q[1]);
        let w23 = _mm256_packs_epi32(q[2], q[3]);
        let b = _mm256_packs_epi16(w01, w23);
        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Σ of the i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)))
    }

    /// [`super::quantize_q8x32`] on AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8x32(x: &[f32], out: &mut [BlockQ8x32]) {
        for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
            // SAFETY: `xb` holds 32 floats; `b.qs` 32 bytes.
            unsafe {
                let amax = amax(xb.as_ptr(), 4);
                let d = amax / 127.0;
                let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                b.d = f16r(d);
                let q: [__m256i; 4] =
                    std::array::from_fn(|i| quants(_mm256_loadu_ps(xb.as_ptr().add(8 * i)), id));
                _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), bytes(q));
                let s = hsum(_mm256_add_epi32(
                    _mm256_add_epi32(q[0], q[1]),
                    _mm256_add_epi32(q[2], q[3]),
                ));
                b.s = f16r(d * s as f32);
            }
        }
    }

    /// [`super::quantize_q8k`] on AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn q8k(x: &[f32], out: &mut [BlockQ8K]) {
        for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
            // SAFETY: `xb` holds 256 floats; `b.qs` 256 bytes.
            unsafe {
                let amax = amax(xb.as_ptr(), 32);
                if amax == 0.0 {
                    b.d = 0.0;
                    b.qs = [0; 256];
                    b.bsums = [0; 16];
                    continue;
                }
                let id = 127.0 / amax;
                b.d = 1.0 / id;
                let idv = _mm256_set1_ps(id);
                for i in 0..8 {
                    let q: [__m256i; 4] = std::array::from_fn(|k| {
                        quants(_mm256_loadu_ps(xb.as_ptr().add(32 * i + 8 * k)), idv)
                    });
                    _mm256_storeu_si256(b.qs.as_mut_ptr().add(32 * i).cast(), bytes(q));
                    // The sums of 16: registers 0+1 and 2+3 of these 32 quants.
                    b.bsums[2 * i] = hsum(_mm256_add_epi32(q[0], q[1])) as i16;
                    b.bsums[2 * i + 1] = hsum(_mm256_add_epi32(q[2], q[3])) as i16;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's `generate_data` from tests/test-quantize-fns.cpp.
    fn generate(offset: f32, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
            .collect()
    }

    fn rmse_over_n(a: &[f32], b: &[f32]) -> f32 {
        let s: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        (s.sqrt() / a.len() as f64) as f32
    }

    #[test]
    fn q8_activation_error_within_ggml_total_quantization_error() {
        let x = generate(0.0, 32 * 128);
        let mut b32 = vec![BlockQ8x32::zeroed(); x.len() / 32];
        quantize_q8x32(&x, &mut b32);
        let y: Vec<f32> = b32
            .iter()
            .flat_map(|b| b.qs.map(|q| q as f32 * b.d))
            .collect();
        assert!(rmse_over_n(&x, &y) < 0.002);
        for b in &b32 {
            let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
            assert!((b.s - b.d * sum as f32).abs() <= 2e-3 * b.s.abs().max(1e-3));
        }
        let mut bk = vec![BlockQ8K::zeroed(); x.len() / 256];
        quantize_q8k(&x, &mut bk);
        let y: Vec<f32> = bk
            .iter()
            .flat_map(|b| b.qs.map(|q| q as f32 * b.d))
            .collect();
        assert!(rmse_over_n(&x, &y) < 0.002);
    }

    #[test]
    fn dispatched_quantizers_are_bit_identical_to_the_scalar_ones() {
        // Ties (x·id landing on .5), zeros, one-hot blocks and random data.
        let mut x = generate(0.3, 256 * 12);
        x[256..512].fill(0.0);
        x[512..768]
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i as f32 - 128.0) * 0.5);
        x[768..800].fill(0.0);
        x[790] = -3.0;
        let mut st = 0x9e3779b97f4a7c15u64;
        for v in &mut x[1024..] {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            *v = ((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 7.0;
        }
        for kind in [ActKind::Q8x32, ActKind::Q8K] {
            let cols = 512;
            let rb = kind.row_bytes(cols);
            let mut fast = vec![0u8; x.len() / cols * rb];
            let mut slow = fast.clone();
            quantize_rows(kind, &x, cols, &mut fast);
            quantize_rows_body(kind, &x, cols, &mut slow);
            assert_eq!(fast, slow, "{kind:?}");
        }
    }

    #[test]
    fn bf16_rows_round_as_ggml_does() {
        // ggml_compute_fp32_to_bf16's cases: ties to even both ways, a carry into the
        // exponent, overflow to infinity, a NaN made quiet, signed zero.
        let cases: [(u32, u16); 7] = [
            (0x3f80_8000, 0x3f80),
            (0x3f81_8000, 0x3f82),
            (0x3f80_8001, 0x3f81),
            (0x3fff_ffff, 0x4000),
            (0x7f7f_ffff, 0x7f80),
            (0x7f80_0001, 0x7fc0),
            (0x8000_0000, 0x8000),
        ];
        let x: Vec<f32> = cases.iter().map(|c| f32::from_bits(c.0)).collect();
        let mut got = vec![0u8; x.len() * 2];
        quantize_rows(ActKind::Bf16, &x, x.len(), &mut got);
        let want: Vec<u8> = cases.iter().flat_map(|c| c.1.to_le_bytes()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn f16_rows_round_as_from_f32_does() {
        // Ties at f16 precision, subnormals, overflow to infinity, signed zeros, a ragged
        // row length (the slice conversion's tail), random values.
        let mut x: Vec<f32> = vec![
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
            -(1.0 + 1.0 / 2048.0),
            6.0e-8,
            3.0e-8,
            -1.0e-6,
            65504.0,
            65520.0,
            1.0e6,
            -1.0e6,
            0.0,
            -0.0,
            f32::INFINITY,
        ];
        let mut st = 0x2545f4914f6cdd1du64;
        while x.len() < 13 * 37 {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            x.push(((st >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 300.0);
        }
        let cols = 37;
        let mut got = vec![0u8; x.len() * 2];
        quantize_rows(ActKind::F16, &x, cols, &mut got);
        let want: Vec<u8> = x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let mut b = [BlockQ8x32::zeroed()];
        quantize_q8x32(&[0.0; 32], &mut b);
        assert_eq!(b[0].d, 0.0);
        assert_eq!(b[0].qs, [0; 32]);
    }

    /// ggml's own activation quantizers (`type_traits_cpu[…].from_float`, what its `mul_mat`
    /// runs), from `fixtures/ggml-kernels` (`cargo xtask ggml-kernel-fixtures`): every row of
    /// the fixture's activations quantized by Synapse (both the scalar and the SIMD drivers)
    /// must give ggml's blocks exactly.
    #[test]
    fn quantizers_equal_ggml_from_float() {
        let d =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/ggml-kernels");
        let x: Vec<f32> = std::fs::read(d.join("x.f32"))
            .expect("fixture x.f32")
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (k, nrows) = (512, x.len() / 512);
        let f16 = |b: &[u8], o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
        let q8_0 = std::fs::read(d.join("act.q8_0.bin")).unwrap();
        let q8_1 = std::fs::read(d.join("act.q8_1.bin")).unwrap();
        let q8_k = std::fs::read(d.join("act.q8_k.bin")).unwrap();
        let mut mine = vec![0u8; ActKind::Q8x32.row_bytes(k) * nrows];
        let mut mine_k = vec![0u8; ActKind::Q8K.row_bytes(k) * nrows];
        quantize_rows(ActKind::Q8x32, &x, k, &mut mine);
        quantize_rows(ActKind::Q8K, &x, k, &mut mine_k);
        let blocks: &[BlockQ8x32] = bytemuck::cast_slice(&mine);
        let blocks_k: &[BlockQ8K] = bytemuck::cast_slice(&mine_k);
        for (i, b) in blocks.iter().enumerate() {
            let g0 = &q8_0[34 * i..34 * i + 34];
            assert_eq!(b.d.to_bits(), f16(g0, 0).to_bits(), "q8_0 block {i} d");
            assert_eq!(b.qs.map(|q| q as u8), g0[2..34], "q8_0 block {i} qs");
            let g1 = &q8_1[36 * i..36 * i + 36];
            assert_eq!(b.d.to_bits(), f16(g1, 0).to_bits(), "q8_1 block {i} d");
            assert_eq!(b.s.to_bits(), f16(g1, 2).to_bits(), "q8_1 block {i} s");
            assert_eq!(b.qs.map(|q| q as u8), g1[4..36], "q8_1 block {i} qs");
        }
        // ggml's Q8_K takes `iscale = −127 / max` (max = the signed value of largest
        // magnitude), so its d and quants carry the sign of −max; Synapse stores the positive
        // orientation (`quantize_q8k`). Every product d·q is the same: compare up to that sign.
        let mut flipped = 0;
        for (i, b) in blocks_k.iter().enumerate() {
            let g = &q8_k[292 * i..292 * i + 292];
            let d = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
            let sg: i32 = if d < 0.0 { -1 } else { 1 };
            flipped += (sg < 0) as usize;
            assert_eq!(b.d.to_bits(), (d * sg as f32).to_bits(), "q8_K block {i} d");
            for e in 0..256 {
                assert_eq!(
                    b.qs[e] as i32,
                    sg * g[4 + e] as i8 as i32,
                    "q8_K block {i} q {e}"
                );
            }
            for s in 0..16 {
                let gs = i16::from_le_bytes([g[260 + 2 * s], g[261 + 2 * s]]);
                assert_eq!(b.bsums[s] as i32, sg * gs as i32, "q8_K block {i} bsum {s}");
            }
        }
        assert!(
            flipped > 0 && flipped < blocks_k.len(),
            "both orientations occur"
        );
        // And the scalar quantizers alone (the SIMD driver above may have taken another path).
        for t in 0..nrows {
            let xr = &x[t * k..(t + 1) * k];
            let mut a = [BlockQ8x32 {
                d: 0.0,
                s: 0.0,
                qs: [0; 32],
            }; 16];
            quantize_q8x32(xr, &mut a);
            for (j, b) in a.iter().enumerate() {
                let o = blocks[t * 16 + j];
                assert_eq!(
                    (b.d.to_bits(), b.s.to_bits(), b.qs),
                    (o.d.to_bits(), o.s.to_bits(), o.qs)
                );
            }
            let mut kb = [BlockQ8K {
                d: 0.0,
                qs: [0; 256],
                bsums: [0; 16],
            }; 2];
            quantize_q8k(xr, &mut kb);
            for (j, b) in kb.iter().enumerate() {
                let o = blocks_k[t * 2 + j];
                assert_eq!(
                    (b.d.to_bits(), b.qs, b.bsums),
                    (o.d.to_bits(), o.qs, o.bsums)
                );
            }
        }
    }
}
